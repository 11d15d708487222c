"""A command's `--out`: a new folder, made whole or not at all, its lock taken over from a killed run and a live
run named; a path the system refuses one line before any work."""
import os
import subprocess
import sys

import pytest

from compare import cli


@pytest.fixture(scope="module")
def good_data(tmp_path_factory, panel) -> str:
    """The default panel as a parquet file: data a command takes, so that only `--out` is wrong."""
    path = tmp_path_factory.mktemp("inputs") / "good.parquet"
    panel.to_parquet(path, index=False)
    return str(path)


def test_out_folder_must_be_new(good_data, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("earlier run")
    code = cli.main(["compare", "--data", good_data, "--out", str(tmp_path)])
    assert code == 2 and "already exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    code = cli.main(["compare", "--data", good_data, "--out", str(tmp_path / "keep.txt")])  # said "not an
    assert code == 2 and "keep.txt' is a file; choose a new folder" in capsys.readouterr().err  # empty folder"
    assert (tmp_path / "keep.txt").read_text() == "earlier run"


def test_the_lock_beside_out_is_not_executable(tmp_path):
    """os.open's default mode is 0o777: the lock file was made executable (under a 022 umask, rwxr-xr-x)."""
    import stat

    from compare.io import atomic_folder

    old = os.umask(0o022)
    try:
        with atomic_folder(tmp_path / "run"):
            mode = stat.S_IMODE((tmp_path / ".run.lock").stat().st_mode)
    finally:
        os.umask(old)
    assert mode == 0o644


def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    """Under a file (named as such, however deep), or in /proc: one line, exit 2, before any work; `bench --json`
    finds out before benchmarking."""
    (tmp_path / "file").write_text("")
    for args, message in ((["compare", "--out", str(tmp_path / "file" / "run")], "/file' is a file, not a folder"),
                          (["seeds", "--out", str(tmp_path / "file" / "a" / "run")], "/file' is a file, not a folder"),
                          (["bench", "--json", "/proc/bench.json"], "choose a writable")):
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("native-loops: error: ") and message in err and err.count("\n") == 1, err
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_an_out_folder_under_one_that_cannot_be_looked_into_is_one_line(tmp_path, capsys, monkeypatch):
    """A parent folder without permission to look into (as root, faked): `Path.exists` raises there, which was a
    traceback."""
    from pathlib import Path

    exists, locked = Path.exists, tmp_path / "locked"

    def denied(self):
        if self == locked or locked in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        return exists(self)

    monkeypatch.setattr(Path, "exists", denied)
    assert cli.main(["compare", "--out", str(locked / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("native-loops: error: ") and "cannot be created (Permission denied" in err
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == []


LONG = "a" * 245  # a file name of 245 bytes is allowed; the temporary names made beside it (+14) are not


@pytest.mark.parametrize("args, message", [
    (["compare", "--out", "{tmp}/link-to-empty"], "is a symbolic link; give the folder it points to"),
    (["compare", "--out", "{tmp}/dangling"], "is a symbolic link"),
    (["compare", "--out", "{tmp}/" + LONG], "cannot be created (File name too long"),
    (["data", "--out", "{tmp}/" + LONG + "aaaaa.parquet"], "File name too long"),
    (["data", "--data", "{tmp}/" + LONG * 2 + ".csv"], "File name too long"),
    (["bench", "--json", "{tmp}/" + LONG * 2 + ".json"], "File name too long"),
], ids=["link", "dangling-link", "long-out", "long-data-out", "long-data", "long-json"])
def test_paths_the_system_refuses_are_one_line_before_any_work(tmp_path, capsys, args, message):
    """An --out that is a symbolic link was refused only by the last rename, after the whole run, with its results
    left in a hidden folder; names too long for the system were tracebacks."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "link-to-empty").symlink_to(tmp_path / "empty")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("native-loops: error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and list((tmp_path / "empty").iterdir()) == []


def test_a_second_run_on_the_same_out_stops_at_once(tmp_path):
    """The run that starts first holds --out (a lock file) from its start: another one stops before any work, and
    the first still lands whole."""
    from compare.errors import NativeLoopsError
    from compare.io import atomic_folder

    out = tmp_path / "run"
    with atomic_folder(out) as first:
        (first / "report.json").write_text("{}")
        with pytest.raises(NativeLoopsError, match="is being written by another run|is not an empty folder"):
            with atomic_folder(out):
                pass
    assert [p.name for p in out.iterdir()] == ["report.json"]


def test_a_failed_run_removes_the_folders_it_made(tmp_path):
    from compare.io import atomic_folder

    out = tmp_path / "a" / "b" / "run"
    with pytest.raises(RuntimeError):
        with atomic_folder(out):
            raise RuntimeError("the work failed")
    assert list(tmp_path.iterdir()) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuntimeError):
        with atomic_folder(empty):
            raise RuntimeError("the work failed")
    assert empty.is_dir() and list(empty.iterdir()) == []  # an empty --out that was there stays as it was


def test_data_out_never_overwrites(tmp_path, capsys):
    target = tmp_path / "panel.parquet"
    target.write_text("mine")
    assert cli.main(["data", "--out", str(target)]) == 2
    assert "already exists; choose a new file" in capsys.readouterr().err and target.read_text() == "mine"


def test_a_killed_runs_lock_and_temporary_folder_are_taken_over(tmp_path, capsys):
    """A run killed with SIGKILL leaves its lock (its pid in it, held by no process) and its temporary folder beside
    --out: the next run says so, removes them and runs; a lock file without a pid (no owner to name) is taken
    silently."""
    from compare.io import atomic_folder

    (tmp_path / ".run.lock").write_text("4194305\n")  # above Linux's largest pid: no such process
    (tmp_path / ".run.k1ll3d00.tmp").mkdir()
    (tmp_path / ".run.k1ll3d00.tmp" / "report.json").write_text("{half")
    with atomic_folder(tmp_path / "run") as tmp:
        (tmp / "report.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert "--out '" + str(tmp_path / "run") + "': a run that was killed (pid 4194305) left its lock and 1 temporary " \
        "folder(s), removed; taken over" in capsys.readouterr().err
    (tmp_path / ".other.lock").write_text("4194305\n")  # another --out's (run.v2's folder must stay: not this one's)
    (tmp_path / ".run.v2.abcd1234.tmp").mkdir()
    with atomic_folder(tmp_path / "other"):
        pass
    assert (tmp_path / ".run.v2.abcd1234.tmp").is_dir()
    capsys.readouterr()
    with atomic_folder(tmp_path / "run.v2x"):  # a name that `.run.v2.*.tmp` would have matched as `run`'s
        pass
    assert (tmp_path / ".run.v2.abcd1234.tmp").is_dir()
    (tmp_path / ".again.lock").write_text("")
    with atomic_folder(tmp_path / "again"):
        pass
    assert capsys.readouterr().err == "" and not (tmp_path / ".again.lock").exists()


def test_a_live_runs_out_is_refused_with_its_pid(tmp_path, capsys):
    """Another process writing --out (holding its lock): one line naming it and its pid, exit 2, nothing touched."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from keras_side.files import Lock; "
                               f"lock = Lock({str(tmp_path / '.run.lock')!r}, 'x'); print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert cli.main(["compare", "--out", str(tmp_path / "run")]) == 2
        assert capsys.readouterr().err == (f"native-loops: error: --out {str(tmp_path / 'run')!r} is being written by "
                                           f"another run, pid {holder.pid}; wait for it to end, or choose another\n")
    finally:
        holder.communicate("")
    assert not (tmp_path / "run").exists()
