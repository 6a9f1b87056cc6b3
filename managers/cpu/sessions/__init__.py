"""Shell sessions: a bash kept open in an environment's sandbox for a whole trajectory, each
command in it one action (its cores granted for the command, the environment's background
allowance between commands).

`host` runs inside the sandbox (one process per session: the shell on a terminal, a Unix socket
it answers on); `shell` is the server's side (`ShellSession`: the name, the cgroup slot its
processes live in, one request at a time over a fresh connection, so an idle session holds no
descriptor of the server's). The CPU manager keeps each environment's sessions on its record;
a backend that can host one implements `Sandbox.start_session_host`.
"""
