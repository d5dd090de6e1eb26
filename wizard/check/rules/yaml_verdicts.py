"""The accelerate YAML as the installed accelerate reads it, once per check: the file the libraries are handed
(the user's, or a scratch copy of text not yet written), accelerate's config loader's verdict and `accelerate
launch` + the script's plugin (wizard.config.validate.accelerate_launch). Cached in the context, so the rules of
every family (accelerate_yaml, libraries, ...) ask the libraries once and share what they said.
"""

from __future__ import annotations

import os
import tempfile

from wizard.check.rules.common import CheckContext, relative_to_naming_file


def yaml_on_disk(ctx: CheckContext) -> str | None:
    """A path whose content is exactly ctx.acc_text: the user's file, or a scratch copy for text not yet
    written (the wizard's pre-write check). A scratch copy gets the ds_config next to it when the YAML names
    a file that does not exist yet."""
    if ctx.acc_text is None:
        return None
    if "acc_disk" in ctx.cache:
        return ctx.cache["acc_disk"]
    path = ctx.acc_path
    try:
        with open(path or "", encoding="utf-8") as f:
            same = f.read() == ctx.acc_text
    except (OSError, UnicodeDecodeError):
        same = False
    ref = ctx.acc_get("deepspeed_config", "deepspeed_config_file")
    # check reads a relative deepspeed_config_file from the launch directory, else beside the YAML
    # (relative_to_naming_file); the libraries get that same file, by absolute path
    resolved = None
    if isinstance(ref, str) and ref:
        resolved = relative_to_naming_file(ref, ctx.acc_path)
    moved = isinstance(ref, str) and ref and resolved and os.path.abspath(resolved) != os.path.abspath(ref)
    # Text not yet written (the wizard's pre-write check) names the final ds_config path, where an older
    # (even unreadable) file may still lie: the libraries must read the JSON being written, not that one.
    missing = isinstance(ref, str) and ref and ctx.ds_text is not None and \
        (not os.path.exists(ref) or (not same and not _holds(ref, ctx.ds_text)))
    if not same or moved:
        scratch = tempfile.mkdtemp(prefix="wizard-check-")
        ctx.cache["scratch_dir"] = scratch
        text = ctx.acc_text
        if moved and os.path.exists(resolved):
            text = text.replace(ref, os.path.abspath(resolved))
        elif missing:
            ds_copy = os.path.join(scratch, "ds_config.json")
            with open(ds_copy, "w", encoding="utf-8") as f:
                f.write(ctx.ds_text)
            # re-rendered, not a text replace: yaml escapes a non-ASCII path
            from wizard.config.emit import yaml_naming
            text = yaml_naming(text, ds_copy)
        path = os.path.join(scratch, "default_config.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    ctx.cache["acc_disk"] = path
    return path


def _holds(path: str, text: str) -> bool:
    """True when the file at `path` is exactly `text` (unreadable or different: False)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() == text
    except (OSError, UnicodeDecodeError):
        return False


def launch_outcome(ctx: CheckContext):
    """accelerate launch + the script's plugin on the YAML (validate.accelerate_launch), cached."""
    if ctx.acc is None:
        return None
    if "launch" not in ctx.cache:
        from wizard.config.validate import accelerate_launch

        path = yaml_on_disk(ctx)
        ctx.cache["launch"] = accelerate_launch(path, planned_gpus=ctx.acc_get("use_cpu") is not True) \
            if path else None
    return ctx.cache["launch"]


def loader_error(ctx: CheckContext) -> str | None:
    """The one-line error of accelerate's real loader on this YAML, None when it loads."""
    if "loader_error" in ctx.cache:
        return ctx.cache["loader_error"]
    error = None
    path = yaml_on_disk(ctx)     # the text being checked, also when it is not written yet
    if path:
        from accelerate.commands.config.config_args import load_config_from_file
        try:
            load_config_from_file(path)
        except Exception as exc:  # noqa: BLE001 - any loader failure is the finding
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    ctx.cache["loader_error"] = error
    return error
