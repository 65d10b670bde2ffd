"""Installing the fastmem provider into a Hermes Agent profile: ``fastmem hermes install``.

Writes the directory plugin Hermes loads (``<hermes_home>/plugins/fastmem/``) and, when
asked, sets ``memory.provider: fastmem`` in the profile's ``config.yaml``. Needs neither
hermes-agent nor PyYAML (with PyYAML the config is parsed; without, its lines are edited).
Public as :func:`fastmem.integrations.hermes.install`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass

import fastmem
from fastmem.errors import InvalidInputError, InvalidTypeError

__all__ = ["PLUGIN_INIT", "PLUGIN_YAML", "STORE_ENV", "InstallResult", "configured_store", "install", "save_settings",
           "settings_path"]

PLUGIN_INIT = '''\
"""fastmem memory provider for Hermes Agent: a MemoryProvider over a fastmem store.

Written by `fastmem hermes install`; the provider itself is
fastmem.integrations.hermes.FastmemProvider (fastmem must be installed in the Python that
runs Hermes). Activate with `memory: {provider: fastmem}` in config.yaml.
"""

import logging

try:
    from fastmem.integrations.hermes import FastmemProvider
except ImportError as exc:  # Hermes reports a failed plugin import only at DEBUG level
    logging.getLogger(__name__).warning(
        "fastmem memory provider: cannot import fastmem (%s); pip install fastmem into the "
        "Python environment that runs Hermes", exc)
    raise


def register(ctx):
    ctx.register_memory_provider(FastmemProvider())
'''

PLUGIN_YAML = '''\
name: fastmem
version: {version}
description: "fastmem: unbounded local memory in two files; a bounded, relevant slice (~1,300 tokens) recalled each turn. No server, no LLM calls."
hooks:
  - on_session_end
  - on_pre_compress
  - on_session_switch
  - on_memory_write
  - on_delegation
'''


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install` did; ``message`` says it for a person."""

    hermes_home: str
    plugin_dir: str
    config_path: str
    activated: bool
    message: str


def _write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".fastmem-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:  # keep the mode of the file replaced (mkstemp makes 0600)
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _provider_in(text: str) -> str | None:
    """memory.provider from config.yaml's text (PyYAML when importable)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        match = re.search(r"^memory:[ \t]*\n(?:[ \t]+.*\n|[ \t]*\n)*?[ \t]+provider:[ \t]*['\"]?([\w.-]*)", text, re.M)
        return match.group(1) if match else None
    data = yaml.safe_load(text) or {}
    memory = data.get("memory") if isinstance(data, dict) else None
    return memory.get("provider") if isinstance(memory, dict) else None


def _activated_text(text: str) -> str:
    """config.yaml's text with memory.provider set to fastmem, the rest kept."""
    try:
        import yaml
    except ImportError:
        return _activated_text_plain(text)
    data = yaml.safe_load(text) if text.strip() else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidInputError("config.yaml does not hold a mapping; set memory.provider by hand")
    memory = data.get("memory")
    if not isinstance(memory, dict):
        memory = data["memory"] = {}
    memory["provider"] = "fastmem"
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def _activated_text_plain(text: str) -> str:
    """Without PyYAML: edit the ``memory:`` block's lines (comments and order kept)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"memory:\s*(#.*)?$", line):
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j][:1] in " \t"):
                if re.match(r"[ \t]+provider:", lines[j]):
                    indent = lines[j][: len(lines[j]) - len(lines[j].lstrip())]
                    lines[j] = f"{indent}provider: fastmem"
                    return "\n".join(lines) + "\n"
                j += 1
            lines.insert(i + 1, "  provider: fastmem")
            return "\n".join(lines) + "\n"
    return text + ("" if not text or text.endswith("\n") else "\n") + "memory:\n  provider: fastmem\n"


def install(hermes_home: str | os.PathLike[str] | None = None, *, activate: bool = False) -> InstallResult:
    """Install the fastmem provider into a Hermes profile (hermes-agent need not be importable).

    Writes ``<hermes_home>/plugins/fastmem/`` (``__init__.py``, ``plugin.yaml``); with
    ``activate``, sets ``memory.provider: fastmem`` in ``<hermes_home>/config.yaml``
    (the rest of the file is kept; the previous file is saved as ``config.yaml.bak``).

    Args:
        hermes_home: the profile directory; ``$HERMES_HOME`` or ``~/.hermes`` by default.
        activate: also set the provider in config.yaml.

    Raises:
        InvalidTypeError: an argument has the wrong type.
        InvalidInputError: config.yaml is not a YAML mapping (with ``activate``).
        OSError: the files cannot be written.
    """
    if hermes_home is not None and not isinstance(hermes_home, (str, os.PathLike)):
        raise InvalidTypeError(f"hermes_home must be a path, not {type(hermes_home).__name__}")
    if not isinstance(activate, bool):
        raise InvalidTypeError("activate must be True or False")
    home = os.fspath(hermes_home) if hermes_home is not None else (
        os.environ.get("HERMES_HOME") or os.path.expanduser("~/.hermes"))  # fmt: skip
    home = os.path.abspath(home)
    plugin_dir = os.path.join(home, "plugins", "fastmem")
    os.makedirs(plugin_dir, exist_ok=True)
    _write_atomic(os.path.join(plugin_dir, "__init__.py"), PLUGIN_INIT)
    _write_atomic(os.path.join(plugin_dir, "plugin.yaml"), PLUGIN_YAML.format(version=fastmem.__version__))

    config_path = os.path.join(home, "config.yaml")
    try:
        with open(config_path, encoding="utf-8-sig") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    active = _provider_in(text) == "fastmem"
    notes = [f"Installed the fastmem memory provider in {plugin_dir}."]
    if activate and not active:
        new_text = _activated_text(text)
        if text:
            _write_atomic(config_path + ".bak", text)
        _write_atomic(config_path, new_text)
        active = True
        notes.append(f"Activated it: memory.provider is fastmem in {config_path}"
                     + (f" (previous file: {config_path}.bak)." if text else "."))  # fmt: skip
    elif active:
        notes.append(f"It is active: memory.provider is fastmem in {config_path}.")
    else:
        notes.append(f"To activate it, set this in {config_path} (or run "
                     f"`fastmem hermes install --activate`):\n  memory:\n    provider: fastmem")  # fmt: skip
    notes.append("Then restart Hermes (CLI and gateway). fastmem must be installed in the Python "
                 "that runs Hermes; memories are kept in " + os.path.join(home, "fastmem") + ".")  # fmt: skip
    return InstallResult(home, plugin_dir, config_path, active, "\n".join(notes))


# --- the provider's own settings: where its stores live -----------------------------------

STORE_ENV = "FASTMEM_HERMES_STORE"  # a cluster location; set in the profile's .env, or here


def settings_path(hermes_home: str) -> str:
    """``<hermes_home>/fastmem/config.json``: the provider's settings (``{"store": ...}``)."""
    return os.path.join(hermes_home, "fastmem", "config.json")


def configured_store(hermes_home: str) -> str | None:
    """The store location the profile names: ``FASTMEM_HERMES_STORE``, else ``store`` in
    ``<hermes_home>/fastmem/config.json``; ``None`` (the profile's own directory) when neither.

    Raises:
        InvalidInputError: config.json is not a JSON object with a string ``store``.
    """
    value = os.environ.get(STORE_ENV)
    if value:
        return value
    try:
        with open(settings_path(hermes_home), encoding="utf-8") as f:
            settings = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{settings_path(hermes_home)}: not readable JSON ({exc})") from None
    store = settings.get("store") if isinstance(settings, dict) else None
    if store is not None and not isinstance(store, str):
        raise InvalidInputError(f"{settings_path(hermes_home)}: store must be a string")
    return store or None


def save_settings(values: dict[str, object], hermes_home: str) -> str:
    """Write ``values`` (``store``) into ``<hermes_home>/fastmem/config.json``, the rest of
    the file kept; the path written."""
    path = settings_path(hermes_home)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        with open(path, encoding="utf-8") as f:
            current = json.load(f)
    except (OSError, ValueError):
        current = {}
    if not isinstance(current, dict):
        current = {}
    current.update({k: v for k, v in values.items() if k == "store"})
    _write_atomic(path, json.dumps(current, indent=2) + "\n")
    return path
