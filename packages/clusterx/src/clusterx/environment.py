"""The environment a job gets: the allow-listed variables of the submitting shell plus those given with --env,
and never a variable whose name looks like a secret (the environment is stored in the database and written into
batch scripts). Kept free of heavy imports: the command line uses it before anything else is loaded."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from clusterx.errors import SpecError

# Variables of the submitting shell a job inherits (exact names, plus every LC_* locale variable).
# Enough to find programs and a Python environment and to keep the locale; nothing that carries credentials.
ENV_ALLOW_LIST = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "TORCHINDUCTOR_CACHE_DIR",
        "OMP_NUM_THREADS",
    }
)

# A key is treated as secret when one of its underscore-separated words is one of these (so MAX_TOKENS_PER_GPU
# is fine, GITHUB_TOKEN and AWS_SECRET_ACCESS_KEY are not).
_SECRET_WORDS = frozenset(
    {"SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY", "PRIVATE"}
)
_SECRET_PAIRS = (("API", "KEY"), ("ACCESS", "KEY"), ("AUTH", "KEY"))
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def looks_secret(key: str) -> bool:
    """True when an environment variable's name suggests it holds a credential."""
    words = key.upper().split("_")
    if any(word in _SECRET_WORDS for word in words):
        return True
    return any(pair in itertools.pairwise(words) for pair in _SECRET_PAIRS)


def env_from_shell(shell_env: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of a shell's environment (see ENV_ALLOW_LIST; LC_* included)."""
    return {k: v for k, v in shell_env.items() if k in ENV_ALLOW_LIST or k.startswith("LC_")}


def parse_env_assignment(text: str) -> tuple[str, str]:
    """'KEY=VALUE' from --env → (KEY, VALUE)."""
    key, sep, value = text.partition("=")
    if not sep or not ENV_KEY.match(key):
        raise SpecError(f"--env {text!r}: expected KEY=VALUE with KEY made of letters, digits and '_'")
    return key, value
