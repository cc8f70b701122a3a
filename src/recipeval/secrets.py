"""What counts as a secret, and how it is kept out of everything recipeval writes or prints.

A value is secret when its name says so (an env name like HF_TOKEN or DB_PASS, a flag like
`wandb-key` or `hf-token`) or when its shape does (credentials inside a URL, a long token with
a known prefix such as hf_/ghp_/sk-/AKIA, a JWT); so is every word a secret flag is given
(`--hf-token a b`) and what a JSON string holds under a secret key (`train-env-vars`). Logs,
result JSON and published outputs are scrubbed (value -> ***); the run history keeps a
fingerprint (a short sha256 prefix) so a change of secret still shows as "changed" without the
value.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
FINGERPRINT_PREFIX = "sha256:"
# Short values (a flag like `--wandb-key x`, a PIN) would mask common words everywhere in a
# log; below this length a secret is still redacted where it is named, never searched for.
MIN_SCRUB_LEN = 6

# A name holds a secret when its last word (split on `_`, `-`, `.`) is a secret word or a
# secret pair (HF_TOKEN, DB_PASS, DB_PWD, WANDB_API_KEY, wandb-key, hf-token, db-password), or
# when any word is SECRET/PASSWORD/CREDENTIAL (AWS_SECRET_ACCESS_KEY); AWS_ACCESS_KEY_ID too. Whole words only, and
# TOKEN only last, so PATH, PASSTHROUGH, COMPASS, KEYBOARD, max-tokens-per-gpu,
# moe-token-dispatcher-type and label-key (miles' flags) are not secrets.
SECRET_NAME = re.compile(
    r"(?:(?:^|[_\-.])(?:TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|PASSPHRASE|CREDENTIALS?|CREDS|AUTH"
    r"|COOKIE|PAT|(?:API|ACCESS|PRIVATE|SECRET|WANDB|HF|CLIENT|SIGNING|ENCRYPTION|AUTH)[_\-.]?KEY(?:[_\-.]ID)?)"
    r"|(?:APIKEY|ACCESSKEY|SECRETKEY|PRIVATEKEY|PASSWORD|PASSWD))$"
    r"|(?:^|[_\-.])(?:SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?:$|[_\-.])",
    re.IGNORECASE,
)
# The shell's working directories, not passwords.
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})

# Value shapes that are secrets whatever they are called.
VALUE_PATTERNS: tuple[re.Pattern[str], ...] = (
    # user:password@ inside a URL (scheme and host stay readable).
    re.compile(r"(?<=://)[^/\s:@'\"\\]*:[^/\s@'\"\\]+(?=@)"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}"),  # OpenAI/Anthropic style API keys
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),  # AWS access key id
    re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\b(?:glpat|npm|pypi)-[A-Za-z0-9_\-]{20,}"),
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"),
)


def is_secret_name(name: str) -> bool:
    """True for an env name or flag name that holds a secret; see SECRET_NAME."""
    name = name.strip()
    return name.upper() not in _NOT_SECRET and SECRET_NAME.search(name) is not None


def has_secret_shape(value: str) -> bool:
    """True when `value` contains URL credentials or a known token shape."""
    return any(p.search(value) for p in VALUE_PATTERNS)


def is_secret(name: str, value: Any) -> bool:
    """A named secret, or a string value that looks like one."""
    return is_secret_name(name) or (isinstance(value, str) and has_secret_shape(value))


def secret_values(
    environ: Mapping[str, str] | None = None, argv: Iterable[str] = (), recipe: Any = None
) -> list[str]:
    """Values to scrub from text: secret-named variables of `environ` (the process's by
    default), the secrets `argv` gives its flags (`--wandb-key V`, `--hf-token=V`) and every
    secret a recipe's values carry (`recipe`: nested or flattened, see carried_secrets);
    longest first so a value containing another is replaced whole."""
    environ = dict(os.environ) if environ is None else environ
    named = [v for k, v in environ.items() if is_secret_name(k)]
    carried = [*carried_secrets(list(argv)), *carried_secrets(recipe)]
    found = {v for v in [*named, *carried] if len(v) >= MIN_SCRUB_LEN}
    return sorted(found, key=len, reverse=True)


def carried_secrets(data: Any, name: str = "") -> list[str]:
    """Every secret inside JSON-like data (a recipe, one of its values, argv words): all that
    a secret name holds (`env.HF_TOKEN`, `hf-token: [a, b]`), the values of secret flags in a
    list of words (`source.args: [train, --wandb-key, V]`) and what a JSON object written as
    a string holds under secret names (`train-env-vars: '{"WANDB_API_KEY": "V"}'`).
    Fingerprints are already safe and are not secrets."""
    if isinstance(data, dict):
        return [s for key, value in data.items() for s in carried_secrets(value, str(key))]
    if is_secret_name(name.rsplit(".", 1)[-1]):
        leaves = data if isinstance(data, list) else [data]
        return [str(v) for v in leaves if _is_secret_leaf(v)]
    if isinstance(data, list):
        words = [str(w) for w in data if not isinstance(w, dict | list)]
        return [*flag_secret_values(words), *(s for item in data for s in carried_secrets(item))]
    if isinstance(data, str):
        return carried_secrets(_json_in(data))
    return []


def _is_secret_leaf(value: Any) -> bool:
    # None/true/false say whether a secret is set, not what it is.
    return (
        value is not None
        and not isinstance(value, bool | dict | list)
        and not is_fingerprint(value)
    )


def _json_in(text: str) -> Any:
    """The JSON object or array `text` holds (a flag such as train-env-vars); None otherwise."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _flag(word: str) -> tuple[str, bool, str] | None:
    """`--name=value` -> (name, True, value), `--name` -> (name, False, ''); None for a value
    (and for `--` alone, which ends the options before a command)."""
    if not word.startswith("--") or len(word) == 2:
        return None
    name, eq, value = word[2:].partition("=")
    return name, bool(eq), value


def secret_word_positions(argv: list[str]) -> set[int]:
    """Where argv holds the words of secret flags. A secret flag takes a value (its name says
    it holds one), so the word after it is that value whatever it starts with
    (`--wandb-key --odd-key` is a key, not a second flag), and every word after that up to the
    next flag is too (a list value, `--hf-token a b`)."""
    positions: set[int] = set()
    in_secret = False  # inside a secret flag's words
    value_due = False  # right after a secret flag written without `=`
    for i, word in enumerate(argv):
        if value_due and word != "--":
            positions.add(i)
            value_due = False
            continue
        value_due = False
        flag = _flag(word)
        if flag is not None:
            name, attached, _ = flag
            in_secret = is_secret_name(name)
            value_due = in_secret and not attached
        elif word == "--":
            in_secret = False
        elif in_secret:
            positions.add(i)
    return positions


def flag_secret_values(argv: list[str]) -> list[str]:
    """The values argv gives to secret flags, as words (see secret_word_positions) or after
    `=` (`--hf-token=V`)."""
    attached = [f[2] for f in map(_flag, argv) if f and f[1] and is_secret_name(f[0])]
    return [*attached, *(argv[i] for i in sorted(secret_word_positions(argv)))]


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace every given secret value and every secret-shaped substring with ***."""
    for value in secrets:
        if value:
            text = text.replace(value, REDACTED)
    for pattern in VALUE_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of env with secret values replaced; names stay so a diff still shows them."""
    return {k: (REDACTED if is_secret_name(k) else scrub(v)) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the values of secret flags replaced (see secret_word_positions) and
    secret-shaped substrings scrubbed."""
    hidden = secret_word_positions(argv)
    out = []
    for i, word in enumerate(argv):
        flag = _flag(word)
        if i in hidden:
            out.append(REDACTED)
        elif flag is not None and flag[1] and is_secret_name(flag[0]):
            out.append(f"--{flag[0]}={REDACTED}")
        else:
            out.append(scrub(word))
    return out


def redact_data(data: Any, name: str = "") -> Any:
    """A JSON-like structure with every secret (by key name or value shape) replaced by ***."""
    if isinstance(data, dict):
        return {
            k: (
                REDACTED
                if is_secret_name(str(k))
                and not isinstance(v, dict | list)
                and v not in (None, False, True)
                else redact_data(v, str(k))
            )
            for k, v in data.items()
        }
    if isinstance(data, list):
        if name == "argv" or name == "entrypoint":
            return redact_argv([str(w) for w in data])
        return [redact_data(v, name) for v in data]
    if isinstance(data, str):
        return scrub(data)
    return data


def fingerprint(value: Any) -> str:
    """A short, stable stand-in for a secret: equal values give equal fingerprints, so the
    history can say "changed" without keeping the value."""
    digest = hashlib.sha256(str(value).encode("utf-8", errors="replace")).hexdigest()
    return f"{FINGERPRINT_PREFIX}{digest[:12]}"


def is_fingerprint(value: Any) -> bool:
    return (
        isinstance(value, str)
        and re.fullmatch(rf"{FINGERPRINT_PREFIX}[0-9a-f]{{12}}", value) is not None
    )


def fingerprint_secrets(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flattened recipe facts (`env.HF_TOKEN`, `args.wandb-key`, ...) with every secret
    value replaced by its fingerprint (see fingerprint_secret)."""
    return {key: fingerprint_secret(key, value) for key, value in values.items()}


def fingerprint_secret(name: str, value: Any) -> Any:
    """`value` as the history and every shown difference keep it: its fingerprint when it is
    a secret (by the last part of `name` or by shape) or carries one (a secret flag in a list
    of words, a secret key in a JSON string); else the value itself."""
    if value is None or isinstance(value, bool) or is_fingerprint(value):
        return value
    leaf = name.rsplit(".", 1)[-1]
    if is_secret_name(leaf) or _has_secret_shape_in(value) or carried_secrets(value):
        return fingerprint(value)
    return value


def _has_secret_shape_in(value: Any) -> bool:
    if isinstance(value, str):
        return has_secret_shape(value)
    if isinstance(value, dict):
        return _has_secret_shape_in(list(value.values()))
    if isinstance(value, list):
        return any(_has_secret_shape_in(v) for v in value)
    return False
