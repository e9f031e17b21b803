"""Print, as `export` lines for a shell, the uv settings that mirror this machine's pip configuration (run by
scripts/install.sh before it installs with uv).

Why: uv resolves and installs the same packages as pip in a fraction of the time (a fresh CPU install here: about 40 s
against pip's 190 s), but it does not read pip's configuration files or PIP_* variables. CI machines and
air-gapped hosts configure pip there (a find-links directory holding torch's CPU wheel, extra local indexes, a
constraints file, a CA bundle), so the install script hands the same to uv. What pip reports (`pip config list`,
which merges the files and the environment) is mapped one to one; an UV_* variable already set wins.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

# pip's option -> uv's variable. pip keys come as `global.find-links`, `install.constraint`, `:env:.find-links`.
MAPPING = {
    "find-links": "UV_FIND_LINKS",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "index-url": "UV_DEFAULT_INDEX",
    "constraint": "UV_CONSTRAINT",
    "cert": "SSL_CERT_FILE",
    "trusted-host": "UV_INSECURE_HOST",
}


def pip_settings(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False).stdout
    settings: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        option = key.rpartition(".")[2]
        if option in MAPPING and value:
            settings[option] = value.strip().strip("'\"")
    return settings


def main() -> int:
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    exports = {"UV_INDEX_STRATEGY": "unsafe-best-match"}  # pip's rule: the best version over every index
    for option, value in pip_settings(python).items():
        exports[MAPPING[option]] = " ".join(value.split())
    for name, value in exports.items():
        if name not in os.environ:
            print(f"export {name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
