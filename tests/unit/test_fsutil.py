"""Atomic writes, .bak, diffs, writability checks, and emit.write_files' both-or-nothing rule."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from wizard import fsutil
from wizard.config import emit
from wizard.errors import InputError


def leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


def test_new_file_is_created_without_backup(tmp_path):
    path = tmp_path / "sub" / "a.yaml"
    result = fsutil.write_atomic(str(path), "x: 1\n")
    assert path.read_text() == "x: 1\n"
    assert (result.changed, result.created, result.backup_path, result.diff) == (True, True, None, "")
    assert not (tmp_path / "sub" / "a.yaml.bak").exists()
    assert leftovers(tmp_path / "sub") == []


def test_unchanged_content_is_not_rewritten(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("x: 1\n")
    os.utime(path, (1_000_000, 1_000_000))
    result = fsutil.write_atomic(str(path), "x: 1\n")
    assert not result.changed and result.backup_path is None and result.diff == ""
    assert os.stat(path).st_mtime == 1_000_000
    assert not (tmp_path / "a.yaml.bak").exists()


def test_changed_content_keeps_bak_and_reports_diff(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("x: 1\ny: 2\n")
    os.chmod(path, 0o640)
    result = fsutil.write_atomic(str(path), "x: 1\ny: 3\n")
    assert path.read_text() == "x: 1\ny: 3\n"
    assert result.backup_path == str(path) + ".bak"
    assert (tmp_path / "a.yaml.bak").read_text() == "x: 1\ny: 2\n"
    assert "-y: 2" in result.diff and "+y: 3" in result.diff
    assert result.changed and not result.created
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert leftovers(tmp_path) == []


def test_failed_rename_leaves_original_byte_identical(tmp_path, monkeypatch):
    path = tmp_path / "a.yaml"
    original = b"x: 1\n# \xc3\xa9 kept byte for byte\n"
    path.write_bytes(original)
    real_replace = os.replace

    def failing_replace(src, dst):
        if os.path.abspath(dst) == str(path):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        fsutil.write_atomic(str(path), "x: 2\n")
    assert path.read_bytes() == original
    assert leftovers(tmp_path) == []


def test_failed_write_of_temp_leaves_nothing_behind(tmp_path, monkeypatch):
    path = tmp_path / "a.yaml"
    path.write_text("old\n")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError):
        fsutil.write_atomic(str(path), "new\n")
    assert path.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_plan_write_touches_nothing(tmp_path):
    path = tmp_path / "a.yaml"
    assert fsutil.plan_write(str(path), "x\n").created
    assert not path.exists()
    path.write_text("x\n")
    assert not fsutil.plan_write(str(path), "x\n").changed
    result = fsutil.plan_write(str(path), "y\n")
    assert result.changed and result.dry_run and "+y" in result.diff
    assert path.read_text() == "x\n" and not (tmp_path / "a.yaml.bak").exists()


def test_restore_undoes_a_write(tmp_path):
    created = fsutil.write_atomic(str(tmp_path / "new.json"), "{}\n")
    fsutil.restore(created)
    assert not (tmp_path / "new.json").exists()
    (tmp_path / "old.json").write_text("old\n")
    replaced = fsutil.write_atomic(str(tmp_path / "old.json"), "new\n")
    fsutil.restore(replaced)
    assert (tmp_path / "old.json").read_text() == "old\n"


@pytest.mark.parametrize("fsync", [True, False])
def test_replace_file_keeps_the_mode_of_what_it_replaces(tmp_path, fsync):
    path = tmp_path / "run.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    fsutil.replace_file(path, b"new bytes", fsync=fsync)
    assert path.read_bytes() == b"new bytes" and os.stat(path).st_mode & 0o777 == 0o640
    fsutil.replace_file(path, "script", mode=0o755, fsync=fsync)
    assert path.read_text() == "script" and os.stat(path).st_mode & 0o777 == 0o755
    assert leftovers(tmp_path) == []


def test_nearest_existing_walks_up_to_a_real_directory(tmp_path):
    assert fsutil.nearest_existing(str(tmp_path / "a" / "b" / "c.json")) == str(tmp_path)
    assert fsutil.nearest_existing(str(tmp_path)) == str(tmp_path)


def test_side_file_readers_return_mappings_or_none(tmp_path):
    good_json, good_yaml = tmp_path / "run.json", tmp_path / "default_config.yaml"
    good_json.write_text('{"status": "running"}')
    good_yaml.write_text("distributed_type: 'NO'\nnum_processes: 1\n")
    assert fsutil.read_json_object(good_json) == {"status": "running"}
    assert fsutil.read_yaml_mapping(good_yaml) == {"distributed_type": "NO", "num_processes": 1}
    for name, text in [("list.json", "[1, 2]"), ("torn.json", '{"status": "run'), ("latin1.json", b"\xff\xfe")]:
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        assert fsutil.read_json_object(path) is None, name
    for name, text in [("list.yaml", "- a\n- b\n"), ("bad.yaml", "a: [1,\n"), ("empty.yaml", "")]:
        (tmp_path / name).write_text(text)
        assert fsutil.read_yaml_mapping(tmp_path / name) is None, name
    assert fsutil.read_json_object(tmp_path / "missing.json") is None
    assert fsutil.read_yaml_mapping(tmp_path) is None                 # a directory


def test_check_writable_dir_accepts_missing_dirs_without_creating_them(tmp_path):
    target = tmp_path / "a" / "b"
    fsutil.check_writable_dir(str(target))
    assert not (tmp_path / "a").exists()


def test_check_writable_dir_rejects_a_path_under_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError) as err:
        fsutil.check_writable_dir(str(tmp_path / "file" / "sub"))
    assert err.value.field == "output_dir"
    with pytest.raises(InputError):
        fsutil.check_writable_dir(str(tmp_path / "file"))


@contextlib.contextmanager
def unwritable(directory):
    """`directory` made unwritable for this process: mode 0500 for a user; for root, who ignores the
    mode bits, the immutable attribute (chattr +i: ext2/3/4, xfs, btrfs; needs CAP_LINUX_IMMUTABLE)."""
    if os.geteuid() != 0:
        os.chmod(directory, 0o500)
        try:
            yield
        finally:
            os.chmod(directory, 0o700)
        return
    chattr = shutil.which("chattr")
    made = chattr and subprocess.run([chattr, "+i", str(directory)], capture_output=True).returncode == 0
    if not made:
        pytest.skip("root, and chattr +i is refused here (see tests/README.md)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)


def test_check_writable_dir_rejects_read_only_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    with unwritable(ro):
        with pytest.raises(InputError):
            fsutil.check_writable_dir(str(ro))
        with pytest.raises(InputError):
            fsutil.check_writable_dir(str(ro / "new"))
        with pytest.raises(OSError):            # and it really is: the check is not stricter than the disk
            (ro / "probe").write_text("")


# ---- the three properties of an atomic write, each pinned by a test that a mutation of it fails ----

@pytest.fixture
def replaces(monkeypatch):
    """Every os.replace (src, dst) made, in order; the real rename still happens."""
    calls, real = [], os.replace

    def spy(src, dst, *args, **kwargs):
        calls.append((os.fspath(src), os.fspath(dst)))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", spy)
    return calls


def test_every_temp_file_is_made_in_the_target_directory(tmp_path, monkeypatch, replaces):
    """A temp in $TMPDIR would make the rename cross file systems (EXDEV) or stop being atomic."""
    elsewhere = tmp_path / "tmpdir"
    elsewhere.mkdir()
    monkeypatch.setenv("TMPDIR", str(elsewhere))
    monkeypatch.setattr(tempfile, "tempdir", str(elsewhere))
    out = tmp_path / "out"
    old_set(out)
    fsutil.replace_file(out / "run.json", "{}\n")
    fsutil.write_atomic(str(out / "ds_config.json"), ds_json(1))
    emit.write_files(ds_yaml(out, 3), ds_json(3), str(out), extra=(("wizard_plan.json", "{}\n"),))
    assert len(replaces) >= 5
    for src, dst in replaces:
        assert os.path.dirname(os.path.abspath(src)) == os.path.dirname(os.path.abspath(dst)) == str(out), (src, dst)
    assert os.listdir(elsewhere) == []


def test_write_atomic_keeps_the_old_content_in_bak_before_replacing_the_file(tmp_path, monkeypatch, replaces):
    path = tmp_path / "a.yaml"
    path.write_text("old\n")
    real = os.replace

    def check_then_replace(src, dst, *args, **kwargs):
        if os.fspath(dst) == str(path):
            assert (tmp_path / "a.yaml.bak").read_text() == "old\n", "the file was replaced before its .bak existed"
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", check_then_replace)
    fsutil.write_atomic(str(path), "new\n")
    assert path.read_text() == "new\n"

    # and when keeping the .bak fails, the file is not touched at all
    def no_bak(src, dst, *args, **kwargs):
        if os.fspath(dst).endswith(".bak"):
            raise OSError(28, "No space left on device")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", no_bak)
    with pytest.raises(OSError):
        fsutil.write_atomic(str(path), "newer\n")
    assert path.read_text() == "new\n"
    assert leftovers(tmp_path) == []


def test_a_bak_is_replaced_whole_never_rewritten_in_place(tmp_path):
    """A reader holding the previous .bak open still reads it whole: the new .bak is a new file renamed
    over it (a write into the same inode could be seen half done, or torn by a crash)."""
    path = tmp_path / "a.yaml"
    path.write_text("v2\n")
    (tmp_path / "a.yaml.bak").write_text("v1\n")
    with open(tmp_path / "a.yaml.bak") as reader:
        fsutil.write_atomic(str(path), "v3\n")
        assert reader.read() == "v1\n"
    assert (tmp_path / "a.yaml.bak").read_text() == "v2\n"

    out = tmp_path / "out"
    before = old_set(out)
    (out / "default_config.yaml.bak").write_text("older\n")
    with open(out / "default_config.yaml.bak") as reader:
        emit.write_files(ds_yaml(out, 3), ds_json(3), str(out))
        assert reader.read() == "older\n"
    assert (out / "default_config.yaml.bak").read_bytes() == before["default_config.yaml"]


# ---- emit.write_files: the YAML, the JSON and the plan as one set --------------------------------

def ds_yaml(out, stage: int) -> str:
    return emit.render_yaml({"distributed_type": "DEEPSPEED", "num_processes": 2,
                             "deepspeed_config": {"deepspeed_config_file": str(out / "ds_config.json"),
                                                  "zero3_init_flag": stage == 3}})


def ds_json(stage: int) -> str:
    return emit.render_json({"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto"})


def old_set(out):
    out.mkdir(exist_ok=True)
    (out / "ds_config.json").write_text(ds_json(2))
    (out / "default_config.yaml").write_text(ds_yaml(out, 2))
    (out / "wizard_plan.json").write_text('{"old": true}\n')
    return snapshot(out)


def snapshot(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def test_write_files_writes_json_then_yaml(tmp_path):
    out = tmp_path / "out"
    results = emit.write_files(ds_yaml(out, 3), ds_json(3), str(out), extra=(("wizard_plan.json", "{}\n"),))
    assert [os.path.basename(r.path) for r in results] == ["ds_config.json", "default_config.yaml"]
    assert (out / "default_config.yaml").read_text() == ds_yaml(out, 3)
    assert (out / "ds_config.json").read_text() == ds_json(3)
    assert sorted(os.listdir(out)) == ["default_config.yaml", "ds_config.json", "wizard_plan.json"]


def test_write_files_keeps_bak_only_for_what_really_changed(tmp_path):
    out = tmp_path / "out"
    before = old_set(out)
    results = emit.write_files(ds_yaml(out, 3), ds_json(3), str(out), extra=(("wizard_plan.json", '{"old": true}\n'),))
    assert all(r.changed and r.backup_path for r in results)
    assert (out / "ds_config.json.bak").read_bytes() == before["ds_config.json"]
    assert (out / "default_config.yaml.bak").read_bytes() == before["default_config.yaml"]
    assert not (out / "wizard_plan.json.bak").exists()          # same content: not rewritten, no backup
    assert sorted(os.listdir(out)) == ["default_config.yaml", "default_config.yaml.bak", "ds_config.json",
                                       "ds_config.json.bak", "wizard_plan.json"]


def test_write_files_dry_run_writes_nothing(tmp_path):
    results = emit.write_files("a: 1\n", "{}\n", str(tmp_path / "out"), dry_run=True)
    assert all(r.dry_run and r.created for r in results)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("failing_rename", [1, 2, 3, 4, 5])
def test_a_failed_rename_rolls_back_to_the_old_set_without_bak(tmp_path, monkeypatch, failing_rename):
    """ENOSPC/EPERM at any rename (an immutable target, a full disk): the old set, byte for byte, nothing else."""
    out = tmp_path / "out"
    before = old_set(out)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == failing_rename:
            raise OSError(1, "Operation not permitted", dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        emit.write_files(ds_yaml(out, 3), ds_json(3), str(out), extra=(("wizard_plan.json", "{}\n"),))
    assert snapshot(out) == before


def test_a_failed_first_write_removes_the_directory_it_created(tmp_path, monkeypatch):
    out = tmp_path / "new" / "out"
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        emit.write_files(ds_yaml(out, 3), ds_json(3), str(out))
    assert os.listdir(tmp_path) == []


def test_write_files_refuses_unwritable_output_before_writing(tmp_path):
    (tmp_path / "blocker").write_text("a file, not a directory")
    with pytest.raises(InputError) as err:
        emit.write_files("a: 1\n", "{}\n", str(tmp_path / "blocker" / "out"))
    assert err.value.field == "output_dir"
    assert (tmp_path / "blocker").read_text() == "a file, not a directory"


@pytest.mark.parametrize("name", ["ds_config.json", "default_config.yaml.bak", "wizard_plan.json"])
def test_write_files_refuses_a_directory_where_a_file_goes(tmp_path, name):
    out = tmp_path / "out"
    before = old_set(out)
    (out / name).unlink(missing_ok=True)
    (out / name).mkdir()
    before = {k: v for k, v in before.items() if k != name}
    with pytest.raises(InputError) as err:
        emit.write_files(ds_yaml(out, 3), ds_json(3), str(out), extra=(("wizard_plan.json", "{}\n"),))
    assert "is a directory" in str(err.value) and "\n" not in str(err.value)
    assert {k: v for k, v in snapshot(out).items() if k != name} == before


def test_write_files_refuses_a_fifo_without_blocking(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "default_config.yaml")
    with pytest.raises(InputError) as err:
        emit.write_files(ds_yaml(out, 3), ds_json(3), str(out))
    assert "is a FIFO" in str(err.value)
    with pytest.raises(InputError):
        emit.write_files(ds_yaml(out, 3), ds_json(3), str(out), dry_run=True)


@pytest.mark.parametrize("content, note", [(b"a: [1,\n", None), (b"\xff\xfe not utf-8", "not UTF-8"),
                                           (b"x" * (fsutil.READ_EXISTING_LIMIT + 1), "no diff shown")])
def test_an_odd_existing_file_is_replaced_and_kept(tmp_path, content, note):
    out = tmp_path / "out"
    out.mkdir()
    (out / "default_config.yaml").write_bytes(content)
    results = emit.write_files(ds_yaml(out, 3), ds_json(3), str(out))
    yaml_result = results[1]
    assert (out / "default_config.yaml").read_text() == ds_yaml(out, 3)
    assert (out / "default_config.yaml.bak").read_bytes() == content
    if note:
        assert note in yaml_result.note and "kept as default_config.yaml.bak" in yaml_result.note
    else:
        assert yaml_result.note is None and "-a: [1," in yaml_result.diff


def test_the_lock_serialises_writers(tmp_path):
    """A writer waits while another holds the directory's lock (and gives up with exit 2 after the timeout)."""
    out = tmp_path / "out"
    out.mkdir()
    with fsutil.dir_lock(str(out)):
        with pytest.raises(InputError) as err:
            with fsutil.dir_lock(str(out), timeout_s=0.2):
                pass
        assert "another wizard" in str(err.value)
    assert not (out / fsutil.LOCK_NAME).exists()
    with fsutil.dir_lock(str(out), timeout_s=0.2):
        pass


def test_bounded_reads_refuse_fifos_big_files_and_deep_nesting(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="is a FIFO"):
        fsutil.read_bytes_limited(tmp_path / "fifo", 100, "answers", "a file")
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="larger than the 100 bytes limit"):
        fsutil.read_bytes_limited(tmp_path / "big", 100, "answers", "a file")
    assert fsutil.read_bytes_limited(tmp_path / "big", 101, "answers", "a file") == b"x" * 101
    for parser in ("json", "yaml"):
        deep = "[" * 100_000 + "]" * 100_000
        with pytest.raises(InputError, match="nests deeper than 100 levels"):
            fsutil.loads_limited(deep, parser, "answers", "f", "a file")
        fsutil.loads_limited("[" * 100 + "]" * 100, parser, "answers", "f", "a file")
        with pytest.raises(InputError, match="nests deeper"):
            fsutil.loads_limited("[" * 101 + "]" * 101, parser, "answers", "f", "a file")
    with pytest.raises(InputError, match="4300"):
        fsutil.loads_limited('{"v": ' + "9" * 5000 + "}", "json", "model", "f", "a file")


# PyYAML's constructors raise plain AttributeError / KeyError / IndexError / ValueError (not
# yaml.YAMLError) for a value an explicit tag or an implicit date can't take.
BAD_TAGGED_YAML = ["x: !!timestamp foo\n", "x: !!bool q\n", 'x: !!int ""\n', "x: 2024-13-45\n"]


@pytest.mark.parametrize("text", BAD_TAGGED_YAML)
def test_yaml_a_tag_cannot_take_is_bad_input_everywhere_it_is_read(tmp_path, text):
    from wizard.check.doctor import load_training_args, parse_accelerate_yaml

    with pytest.raises(InputError, match="answers"):
        fsutil.loads_limited(text, "yaml", "answers", "f", "a file")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert fsutil.read_yaml_mapping(path) is None
    with pytest.raises(InputError, match="training-args"):
        load_training_args(str(path))
    with pytest.raises(InputError, match="config-file: .* is not valid YAML"):
        parse_accelerate_yaml(text, str(path))


def test_one_line_quoting_of_paths():
    assert fsutil.quote_path("/tmp/a\nb") == '"/tmp/a\\nb"'
    assert fsutil.quote_path("/tmp/out_ü") == '"/tmp/out_ü"'


# ---- one YAML reader, bounded against alias bombs (issue 21 #9) ----------------------------------

def nine_by_nine() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


YAML_BOMBS = {
    "nine-levels": nine_by_nine(),
    "long-text": "s: &s " + "x" * 60_000 + "\nt: [" + ", ".join(["*s"] * 300) + "]\n",
    "self-reference": "a: &a [1, *a]\n",
}


@pytest.mark.parametrize("name", sorted(YAML_BOMBS))
def test_every_yaml_reader_refuses_an_alias_bomb_at_once(tmp_path, name):
    import time

    from wizard.check.doctor import load_training_args, parse_accelerate_yaml

    text = YAML_BOMBS[name]
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(InputError, match="answers: .*(aliases expand it|refers to the node)"):
        fsutil.loads_limited(text, "yaml", "answers", "f", "a file")
    with pytest.raises(InputError, match="config-file: .* is refused"):
        parse_accelerate_yaml(text, str(path))
    with pytest.raises(InputError, match="training-args: .* is refused"):
        load_training_args(str(path))
    assert fsutil.read_yaml_mapping(path) is None
    assert time.monotonic() - started < 5


def test_aliases_within_the_limits_load_as_yaml_safe_load_loads_them():
    import yaml

    five_levels = nine_by_nine().split("a5:")[0]     # 9**5 leaves: within the limit
    text = "base: &b {lr: 1.0e-05, steps: [1, 2]}\nrun: *b\nother: {<<: *b, lr: 2}\n" + five_levels
    assert fsutil.yaml_load(text) == yaml.safe_load(text)
    # Each level is one sequence of nine copies of the one before: 10, 91, 820, 7381, 66430 values.
    values, chars = fsutil.yaml_expansion(fsutil.yaml_parse(five_levels)[1])
    assert (values, chars) == (1 + 5 + 10 + 91 + 820 + 7381 + 66430, 5 * 2 + sum(9 ** k for k in range(1, 6)))
    assert values <= fsutil.MAX_YAML_VALUES < 1 + 6 + 10 + 91 + 820 + 7381 + 66430 + 597871


def test_no_module_reads_yaml_around_the_bounded_loader():
    """yaml.safe_load / load / compose anywhere in wizard/ or launch/ would bypass the alias check."""
    import re
    from pathlib import Path

    root = Path(fsutil.__file__).resolve().parents[1]
    pattern = re.compile(r"yaml\.(safe_load|load|full_load|unsafe_load|compose|load_all|safe_load_all|parse)\(")
    sources = [path for base in ("wizard", "launch") for path in (root / base).rglob("*.py") if path.name != "fsutil.py"]
    offenders = [f"{path.relative_to(root)}:{n}" for path in sources
                 for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


# ---- a refused rename, at any step, leaves the old set as it was (issue 21 #10) --------------------

def old_set_with_baks(out) -> dict[str, bytes]:
    """An old set that has been written twice already: every config and its .bak."""
    old_set(out)
    (out / "ds_config.json.bak").write_text(ds_json(1))
    (out / "default_config.yaml.bak").write_text(ds_yaml(out, 1))
    (out / "wizard_plan.json.bak").write_text('{"older": true}\n')
    return full_snapshot(out)


def full_snapshot(out) -> dict[str, tuple[bytes, int]]:
    """Every entry (hidden ones too: temps, the lock), with its bytes and mode."""
    return {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(out.iterdir())}


def write_new_set(out):
    return emit.write_files(ds_yaml(out, 3), ds_json(3), str(out), extra=(("wizard_plan.json", "{}\n"),))


@contextlib.contextmanager
def unreplaceable(path, how: str):
    """`path` made a file that no rename may replace: immutable (chattr +i), or a bind mount over it (EBUSY)."""
    if how == "chattr":
        chattr = shutil.which("chattr")
        if not chattr or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is refused here (not root, or a file system without the attribute)")
        try:
            yield
        finally:
            subprocess.run([chattr, "-i", str(path)], check=True)
        return
    source = path.parent.parent / (path.name + ".mounted")
    source.write_bytes(path.read_bytes())
    if not shutil.which("mount") or subprocess.run(["mount", "--bind", str(source), str(path)],
                                                    capture_output=True).returncode != 0:
        pytest.skip("mount --bind is refused here (not root)")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("how", ["chattr", "bind-mount"])
@pytest.mark.parametrize("name", ["ds_config.json", "default_config.yaml", "wizard_plan.json",
                                  "ds_config.json.bak", "default_config.yaml.bak"])
def test_a_file_no_rename_can_replace_leaves_the_old_set_exactly_as_it_was(tmp_path, how, name):
    out = tmp_path / "out"
    old_set_with_baks(out)
    with unreplaceable(out / name, how):
        before = full_snapshot(out)
        with pytest.raises(OSError) as err:
            write_new_set(out)
        assert full_snapshot(out) == before      # the configs, the old .bak files; no temp, no staged JSON, no lock
    assert err.value.filename == str(out / name)   # the message names the file the user knows, not a temp


class ReplaceFaults:
    """os.replace that fails with EPERM at the Nth call; with `sticky`, also at every later call onto that same
    target (a file that became unreplaceable), as chattr +i or a mount would make it."""

    def __init__(self, monkeypatch, at: int, sticky: bool):
        self.real, self.at, self.sticky, self.calls, self.broken = os.replace, at, sticky, 0, None
        self.replaced: set[str] = set()          # targets a rename has already replaced
        monkeypatch.setattr(os, "replace", self)

    def __call__(self, src, dst, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at or (self.sticky and os.fspath(dst) == self.broken):
            self.broken = os.fspath(dst)
            raise OSError(1, "Operation not permitted", os.fspath(dst))
        self.real(src, dst, *args, **kwargs)
        self.replaced.add(os.fspath(dst))


@pytest.mark.parametrize("links", ["hard links", "no hard links"])
@pytest.mark.parametrize("sticky", [False, True], ids=["fails-once", "fails-for-good"])
def test_an_injected_rename_failure_at_every_step_leaves_the_old_set_exactly_as_it_was(tmp_path, monkeypatch,
                                                                                       links, sticky):
    """Every os.replace of a set write (the staged YAML, the JSON, the YAML, the plan, each .bak; with no hard
    links, the copies of the originals too) fails in turn, once or for good: the old set, byte for byte.

    The one exception: the YAML refused for good between its two renames (it was replaceable a moment before)
    cannot be put back; the write then says which files are new, and the disk is still a YAML beside the JSON
    it names, with the old YAML kept."""
    if links == "no hard links":
        def no_link(*args, **kwargs):
            raise OSError(1, "Operation not permitted")
        monkeypatch.setattr(os, "link", no_link)
    rollbacks_failed = 0
    for at in range(1, 100):
        out = tmp_path / f"out{at}"
        before = old_set_with_baks(out)
        faults = ReplaceFaults(monkeypatch, at, sticky)
        try:
            write_new_set(out)
        except fsutil.RollbackFailed as err:
            rollbacks_failed += 1
            assert sticky and faults.broken == str(out / "default_config.yaml")
            assert err.new_files == [str(out / "default_config.yaml")] and "default_config.yaml holds the new content" in str(err)
            doc = fsutil.read_yaml_mapping(out / "default_config.yaml")
            named = doc["deepspeed_config"]["deepspeed_config_file"]
            assert os.path.basename(named).startswith(emit.STAGED_DS_PREFIX)
            assert (out / named).read_text() == ds_json(3)
            assert [Path(p).read_bytes() for p in err.kept] == [before["default_config.yaml"][0]]
        except OSError:
            assert full_snapshot(out) == before, f"rename {at} failed {'for good' if sticky else 'once'}"
        else:
            break
        finally:
            monkeypatch.setattr(os, "replace", faults.real)
    assert at > 7      # 4 renames of the set and 3 .bak (more with copies) were each refused in turn
    assert rollbacks_failed == (1 if sticky else 0)


def _times_open(path) -> int:
    """How many file descriptors of this process point at `path` now."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see the waiter's open file")
def test_a_waiter_that_locked_a_file_already_unlinked_locks_the_new_one(tmp_path):
    """The holder unlinks .wizard.lock before closing it; a waiter that then gets the lock on that dead file
    must not go ahead (a third writer would lock a new file at the path at the same time): it retries."""
    import fcntl
    import threading
    import time

    out = tmp_path / "out"
    out.mkdir()
    path = out / fsutil.LOCK_NAME
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    inside, leave = threading.Event(), threading.Event()

    def waiter():
        with fsutil.dir_lock(str(out), timeout_s=10):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        deadline = time.monotonic() + 10          # until the waiter has the holder's file open too, and waits on it
        while _times_open(path) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not inside.is_set()
        os.unlink(path)                           # the holder's release: unlink, then close
        os.close(holder)
        assert inside.wait(5)
        with pytest.raises(InputError, match="another wizard"):
            with fsutil.dir_lock(str(out), timeout_s=0.3):
                pass                              # a third writer while the waiter holds the directory
    finally:
        leave.set()
        thread.join(10)
