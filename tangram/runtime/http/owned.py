"""The environments a client may not address: the `/run_code` warm pool's, which the server
opens, resets and hands to one request at a time (`sandboxfusion.warm`). Every
`/v1/envs/{env_id}...` route refuses them, so a client that saw a pooled id in its response
cannot reach the sandbox of a later request."""

from __future__ import annotations

from fastapi import Request

from tangram.errors import ValidationError
from tangram.runtime.sandboxfusion.warm import POOLED, pooled


async def not_pooled(request: Request) -> None:
    """A router dependency: 422 naming `env_id` when the path names a pooled environment."""
    env_id = request.path_params.get("env_id")
    if env_id is not None and pooled(request.app.state.tangram, env_id):
        raise ValidationError("env_id", env_id, POOLED)
