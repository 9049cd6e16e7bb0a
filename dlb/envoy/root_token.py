"""The secret a root Envoy shows a leaf Envoy so the leaf trusts its ``x-dlb-src-cell`` (issue 14 row 9).

A leaf's listener faces the network: anyone who reaches it could claim to come from another cell (and
get that cell's emulated WAN delay, or be counted as its demand by MNLB). Roots therefore add
``x-dlb-root-token`` with the deployment's secret; the leaf's WAN-delay filters match it, its routes
drop ``x-dlb-src-cell`` from a request without it, and it never reaches the servers or the access log.

The secret comes from ``root_token_file`` in the config. Without one it is derived from the cells'
names and addresses, so every renderer of one config (``dlb config bootstrap``, ``dlb up``, the control
plane) agrees without a setting: that stops a client that has not read the config, nothing more —
set ``root_token_file`` wherever the config is not itself secret. Pure: no I/O.

The token never travels in xDS: a root Envoy's listener only names the secret :data:`SECRET`, which
its own bootstrap defines from the token file (Envoy's ``credential_injector`` adds the header), and a
leaf Envoy's Lua check reads the file itself. So a reader of the control plane's resources (``/status``,
a config dump of any node) learns the file's path, never the token.
"""

from __future__ import annotations

from typing import Any

from dlb.config.model import Config
from dlb.envoy.contract import ROOT_TOKEN, SRC_CELL

#: The name of the Envoy generic secret that holds the token (a root's bootstrap defines it).
SECRET = "dlb-root-token"
TOKEN_FILTER = "envoy.filters.http.credential_injector"
TOKEN_CHECK = "dlb.root_token_check"


def root_token(cfg: Config) -> str:
    """The token roots of ``cfg`` send and its leaves require (``cfg.root_token`` or the derived one)."""
    return cfg.root_token or cfg.derived_root_token()


def forgeable_token_warning(cfg: Config) -> str | None:
    """Why the root token is weak here, or None: no ``root_token_file`` while a leaf Envoy binds beyond loopback.

    Why a warning and not a problem: a derived token still stops a client that has not read the config,
    and a one-host or closed-network deployment needs no secret; but where clients can reach a leaf, anyone
    who has read the config (an example in a public repository) can claim a source cell. Every tool that
    starts or checks a deployment says so, in the same words.
    """
    if cfg.root_token:
        return None
    exposed = [c.name for c in cfg.cells if not c.leaf.bind.loopback]
    if not exposed:
        return None
    return (f"{cfg.source}: root_token_file is not set and the leaf Envoy of {', '.join(exposed)} listens beyond "
            "loopback: its root token is derived from the config, so anyone who has read the config can set "
            "x-dlb-src-cell there; set root_token_file (docs/security.md)")


def token_secret(cfg: Config) -> dict[str, Any]:
    """The bootstrap's static secret :data:`SECRET`: the token file by path, or the derived token inline.

    Why a static secret and not SDS from the control plane: the token is then on the Envoy's own disk (a
    mounted Secret in Kubernetes, ``dlb up``'s run folder), and xDS carries only its name.
    """
    if cfg.root_token_file:
        return token_file_secret(cfg.root_token_file)
    return {"name": SECRET, "generic_secret": {"secret": {"inline_string": root_token(cfg)}}}


def token_file_secret(path: str) -> dict[str, Any]:
    """:data:`SECRET` read from ``path`` (a mounted Kubernetes Secret, say)."""
    return {"name": SECRET, "generic_secret": {"secret": {"filename": path}}}


def token_injector() -> dict[str, Any]:
    """The root's HTTP filter adding ``x-dlb-root-token`` from :data:`SECRET` to every request it forwards."""
    return {
        "name": TOKEN_FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
            "overwrite": True,
            "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
                "credential": {"name": SECRET}, "header": ROOT_TOKEN}},
        },
    }


def _lua_string(text: str) -> str:
    """``text`` as a Lua string literal (decimal escapes for all but plain path characters)."""
    return '"' + "".join(chr(b) if b < 128 and (chr(b).isalnum() or chr(b) in "/-_.") else f"\\{b:03d}" for b in text.encode()) + '"'


#: Lua for the leaf: the token is read once per worker from the file (``false`` if unreadable: trust no one).
_CHECK = """local path, inline = %s, %s
local token = nil
function envoy_on_request(h)
  if token == nil then
    token = inline
    if path then
      local f = io.open(path, "rb")
      token = f and (f:read("*a") or ""):match("^%%s*(.-)%%s*$") or false
      if f then f:close() end
      if not token or #token < 16 then token = false; h:logErr("dlb: cannot read root token file " .. path) end
    end
  end
  local hs = h:headers()
  if not token or hs:get("%s") ~= token then hs:remove("%s") end
  hs:remove("%s")
end
"""


def token_check(cfg: Config) -> dict[str, Any]:
    """The leaf's first HTTP filter: drop ``x-dlb-src-cell`` unless the request has the roots' token, then drop the token.

    Envoy's header matchers need the value in the config (which xDS would carry), so a Lua filter reads
    the token file; the filters after it (WAN delay) and the access log see only a trusted source cell.
    """
    path, inline = (_lua_string(cfg.root_token_file), "nil") if cfg.root_token_file else ("nil", _lua_string(root_token(cfg)))
    code = _CHECK % (path, inline, ROOT_TOKEN, SRC_CELL, ROOT_TOKEN)
    return {"name": TOKEN_CHECK, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "default_source_code": {"inline_string": code}}}
