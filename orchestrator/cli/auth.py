"""Ray token authentication for rayward's client commands (scale, submit, status, logs, stop, list).

Ray 2.60 clients send the cluster token only when RAY_AUTH_MODE=token is in their environment; without it
the Jobs API answers 401 and `ray.init("host:port")` hangs ~20 s and then blames the network. rayward finds
the token where Ray documents it (token-auth docs), in Ray's order, and turns token mode on when it finds one:
  1. RAY_AUTH_TOKEN        (the token itself)
  2. RAY_AUTH_TOKEN_PATH   (a file holding it)
  3. ~/.ray/auth_token     (written by `ray get-auth-token --generate` or a local `ray.init()`)
RAY_AUTH_MODE=disabled, set by the user, is respected.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TOKEN_FILE = Path("~/.ray/auth_token")


class AuthError(RuntimeError):
    """No usable token, or the cluster refused it; the message says what to do."""


def find_token() -> tuple[str | None, str]:
    """(token, where it came from) following Ray's lookup order; (None, reason) if there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    path_env = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path_env:
        p = Path(path_env).expanduser()
        if not p.is_file() or not p.read_text().strip():
            raise AuthError(f"RAY_AUTH_TOKEN_PATH={path_env} is not a readable, non-empty token file")
        return p.read_text().strip(), f"RAY_AUTH_TOKEN_PATH ({p})"
    p = DEFAULT_TOKEN_FILE.expanduser()
    if p.is_file() and p.read_text().strip():
        return p.read_text().strip(), str(p)
    return None, "no RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"


def prepare_client_auth() -> str:
    """Make this process's Ray clients send the token; returns a one-line description of what was done."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return "token auth disabled by RAY_AUTH_MODE=disabled"
    token, source = find_token()
    if token is None:
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
            raise AuthError(f"RAY_AUTH_MODE=token but {source}; get the cluster's token "
                            "(`ray get-auth-token` on the head) and set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
        return f"no token found ({source}); connecting without one"
    os.environ["RAY_AUTH_MODE"] = "token"
    _refresh_ray_config()
    return f"token from {source}"


def _refresh_ray_config() -> None:
    """Ray caches RAY_AUTH_MODE in its config when `ray` is imported; if it already was (a test session, a
    notebook), refresh it as Ray's own _enable_token_auth does, or this process and its clusters disagree."""
    import sys

    if "ray" in sys.modules:
        from actors.runtime.ray_compat import refresh_config

        refresh_config()


def explain_auth_failure(err: BaseException, address: str) -> str | None:
    """A clear one-line message for Ray's 401/403 errors, or None if `err` is not about auth."""
    text = str(err)
    if "Missing authentication token" in text or "401" in text and "auth" in text.lower():
        return (f"the Ray cluster at {address} requires a token and none was sent: set RAY_AUTH_TOKEN or "
                "RAY_AUTH_TOKEN_PATH (get it with `ray get-auth-token` on the head), or put it in ~/.ray/auth_token")
    if "Invalid authentication token" in text or "Forbidden" in text:
        return f"the Ray cluster at {address} rejected the token (wrong token for this cluster)"
    return None
