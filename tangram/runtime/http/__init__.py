"""The HTTP server's parts, one job each: `limits` (every request bound, shared by the native
API and SandboxFusion's endpoints), `schemas` (request and response bodies), `errors` (the one
error shape and the mapping from Tangram's errors to status codes), `body` (the body guard
middleware), `routes` (the native endpoints), `env_routes` (the routes of environments' trees:
fork, snapshots, files in and out), `owned` (the environments a client may not address).
`tangram.runtime.server` assembles them into the app and serves it. Importing this package
loads none of them."""
