"""An output path never replaces a file the user owns: an absent path or an empty file is
written, a file that fastslow-sim wrote (told from its content) is replaced, any other file is
refused in one sentence before any work, its bytes unchanged and no `.part` left behind."""

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import h5py
import matplotlib

matplotlib.use("Agg")  # this test process only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import xarray as xr  # noqa: E402
from PIL import Image  # noqa: E402
from test_cli_extremes import invoke  # noqa: E402
from test_gallery import TINY  # noqa: E402

import fastslow_sim as fs  # noqa: E402
from fastslow_sim import gallery  # noqa: E402
from fastslow_sim.analysis import save_figure  # noqa: E402
from fastslow_sim.io import save_json, written_by_us  # noqa: E402

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def _text(path):
    path.write_text("my notes\n")


def _pil_png(path):
    Image.new("RGB", (4, 4), "red").save(path, format="png")


def _matplotlib_png(path):  # matplotlib's own Software text, not ours
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    fig.savefig(path, format="png")
    plt.close(fig)


def _hdf5(path):
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "someone else's data"
        f["x"] = np.arange(3)


def _netcdf_of_xarray(path):  # a NetCDF-4 file, but written by plain xarray
    xr.Dataset({"x": ("t", np.arange(3))}).to_netcdf(path, engine="h5netcdf")


FOREIGN = [_text, _pil_png, _matplotlib_png, _hdf5, _netcdf_of_xarray]


def _refused(res, path, before):
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("Error: the "), res.output
    assert f"{path.name}'" in res.output  # the path is named
    assert "never replaced" in res.output
    assert path.read_bytes() == before
    assert not list(path.parent.rglob("*.part"))


@pytest.mark.parametrize("make", FOREIGN, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_cli_refuses_a_foreign_file_before_any_work(make, option, tmp_path, monkeypatch):
    target = tmp_path / ("notes.nc" if option == "--out" else "notes.png")
    make(target)
    before = target.read_bytes()
    args = ["integrate", "--eps", "0.1", "--t-end", "0.5", option, str(target)]
    if option == "--plot":
        args += ["--out", str(tmp_path / "r.nc")]
    res = invoke(args, tmp_path, monkeypatch)
    _refused(res, target, before)
    assert "did not write" in res.output
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no dataset, no plot


def test_the_issue_example_notes_txt(tmp_path, monkeypatch):
    notes = tmp_path / "notes.txt"
    _text(notes)
    res = invoke(["integrate", "--eps", "0.1", "--out", "notes.txt"], tmp_path, monkeypatch)
    _refused(res, notes, b"my notes\n")
    assert res.output == ("Error: the dataset path 'notes.txt' holds a file that fastslow-sim did "
                          "not write; it is never replaced: remove it or choose another path.\n")  # fmt: skip


@pytest.mark.parametrize("make", FOREIGN, ids=lambda f: f.__name__.strip("_"))
def test_save_dataset_and_save_figure_refuse_a_foreign_file(make, tmp_path):
    ds = fs.integrate(fs.make_system("two-state", eps=0.1), (0, 1), n_eval=5)
    for path, write in [(tmp_path / "a.nc", lambda p: fs.save_dataset(ds, p)),
                        (tmp_path / "a.png", lambda p: save_figure(plt.figure(), p)),
                        (tmp_path / "a.pdf", lambda p: save_figure(plt.figure(), p))]:  # fmt: skip
        make(path)
        before = path.read_bytes()
        with pytest.raises(fs.InputError, match="did not write; it is never replaced") as err:
            write(path)
        assert "\n" not in str(err.value) and str(path) in str(err.value)
        assert path.read_bytes() == before
    assert not list(tmp_path.glob(".*part"))


def test_a_second_run_replaces_the_first_runs_files(tmp_path, monkeypatch):
    out, plot = tmp_path / "r.nc", tmp_path / "r.png"
    plots = []
    for eps in (0.1, 0.05):
        res = invoke(["integrate", "--eps", str(eps), "--t-end", "0.5", "--out", str(out),
                    "--plot", str(plot)], tmp_path, monkeypatch)  # fmt: skip
        assert res.exit_code == 0, res.output
        assert fs.load_dataset(out).attrs["eps"] == eps
        plots.append(plot.read_bytes())
    assert plots[0] != plots[1] and written_by_us(plot) and written_by_us(out)


def test_a_dataset_derived_from_ours_is_the_users(tmp_path, monkeypatch):
    """A dataset of ours loaded, changed and saved with its attributes kept (xarray keeps them)
    carries our mark but no longer our digest: it is the user's and never replaced; ours, or
    an unchanged copy, still is ours."""
    out = tmp_path / "r.nc"
    res = invoke(["integrate", "--eps", "0.1", "--t-end", "0.5", "--no-plot", "--out", str(out)],
                 tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert written_by_us(out)
    ds = fs.load_dataset(out)
    derived = {"edited.nc": ds.assign(x=ds["x"] * 2), "subset.nc": ds.isel(time=slice(0, 5)),
               "noted.nc": ds.assign_attrs(note="mine"), "copy.nc": ds}  # fmt: skip
    for name, d in derived.items():
        d.to_netcdf(tmp_path / name, engine="h5netcdf")
        assert fs.io.DIGEST_KEY in d.attrs  # the derived file carries our mark and digest
    assert not any(written_by_us(tmp_path / n) for n in ("edited.nc", "subset.nc", "noted.nc"))
    assert written_by_us(tmp_path / "copy.nc")  # the same content
    before = (tmp_path / "edited.nc").read_bytes()
    res = invoke(["integrate", "--eps", "0.1", "--t-end", "0.5", "--no-plot", "--out",
                  "edited.nc"], tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 2 and "did not write; it is never replaced" in res.output
    assert (tmp_path / "edited.nc").read_bytes() == before
    # without the digest the mark proves nothing: xarray's concat and merge keep our version
    # attribute and drop the digest when the inputs' digests differ (helper-20)
    other = fs.save_dataset(ds.assign(x=ds["x"] + 1), tmp_path / "other.nc")
    both = xr.concat([fs.load_dataset(out), fs.load_dataset(other)], dim="run",
                     combine_attrs="drop_conflicts")  # fmt: skip
    assert fs.io.VERSION_KEY in both.attrs and fs.io.DIGEST_KEY not in both.attrs
    both.to_netcdf(tmp_path / "combined.nc", engine="h5netcdf")
    assert not written_by_us(tmp_path / "combined.nc")
    # the digest sees a variable's dimensions and a group's attributes
    grid = fs.save_dataset(xr.Dataset({"a": (("i", "j"), np.eye(3)), "b": ("i", np.arange(3.0))}),
                           tmp_path / "grid.nc")  # fmt: skip
    moved = fs.load_dataset(grid)
    moved.assign(b=("j", moved["b"].values)).to_netcdf(tmp_path / "moved.nc", engine="h5netcdf")
    assert written_by_us(grid) and not written_by_us(tmp_path / "moved.nc")
    shutil.copy(grid, tmp_path / "noted-group.nc")
    with h5py.File(tmp_path / "noted-group.nc", "r+") as f:
        f.create_group("mynotes").attrs["lab_book"] = "page 12"
    assert not written_by_us(tmp_path / "noted-group.nc")


def test_default_outputs_rerun(tmp_path, monkeypatch):
    for _ in range(2):  # both runs write the same dataset and plot in ./fastslow-results/
        res = invoke(["integrate", "--eps", "0.125", "--t-end", "0.5"], tmp_path, monkeypatch)
        assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "fastslow-results").iterdir()) == [
        "integrate-birth-death-eps0.125.nc", "integrate-birth-death-eps0.125.png"]


def test_an_empty_file_is_written_and_a_link_is_followed(tmp_path, monkeypatch):
    empty = tmp_path / "empty.nc"  # as from mktemp
    empty.touch()
    res = invoke(["integrate", "--eps", "0.1", "--t-end", "0.5", "--out", str(empty), "--no-plot"],
               tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert fs.load_dataset(empty).attrs["eps"] == 0.1
    link = tmp_path / "link.nc"
    link.symlink_to(empty)  # a link to our file: followed, the file replaced, the link kept
    res = invoke(["integrate", "--eps", "0.2", "--t-end", "0.5", "--out", str(link), "--no-plot"],
               tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and fs.load_dataset(empty).attrs["eps"] == 0.2
    notes = tmp_path / "notes.txt"  # a link to the user's file: judged by the file, refused
    _text(notes)
    (tmp_path / "to-notes.nc").symlink_to(notes)
    res = invoke(["integrate", "--eps", "0.1", "--out", "to-notes.nc", "--no-plot"], tmp_path,
               monkeypatch)  # fmt: skip
    _refused(res, notes, b"my notes\n")
    assert f"'to-notes.nc' (a link to {str(notes)!r}) holds" in res.output
    assert (tmp_path / "to-notes.nc").is_symlink()


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg", "svgz", "eps", "ps", "tif", "tiff", "webp"])
def test_every_marked_figure_format_is_recognised(fmt, tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / f"f.{fmt}")
    assert written_by_us(path)
    save_figure(plt.figure(), path)  # and so replaced by the next one
    assert written_by_us(path)


@pytest.mark.parametrize("fmt", ["raw", "jpg", "gif"])
def test_a_figure_format_without_a_mark_is_written_once(fmt, tmp_path):
    """JPEG and GIF could carry a comment, but Pillow copies it into a file that a user opens,
    edits and saves (helper-20), so they carry none."""
    path = save_figure(plt.figure(), tmp_path / f"f.{fmt}")
    with pytest.raises(fs.InputError, match=rf"a \.{fmt} figure carries no mark"):
        save_figure(plt.figure(), path)


@pytest.mark.parametrize("fmt", ["tiff", "webp", "png"])
def test_our_figure_edited_and_saved_with_pillow_is_the_users(fmt, tmp_path):
    from PIL import ImageDraw

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / f"f.{fmt}")
    assert written_by_us(path)
    with Image.open(path) as im:
        im.load()
        ImageDraw.Draw(im).text((10, 10), "MY NOTE")
        im.save(path)
    assert not written_by_us(path)


@pytest.mark.parametrize("fmt", ["jpg", "gif", "tiff", "webp"])
def test_an_image_of_the_users_in_a_pillow_format_is_not_ours(fmt, tmp_path):
    """The same format written by the user's own Pillow or matplotlib, with or without a comment
    or Software tag of its own (one that only begins like ours too): never replaced."""
    im = Image.new("RGB", (4, 4))
    plain, tagged = tmp_path / f"plain.{fmt}", tmp_path / f"tagged.{fmt}"
    im.save(plain)
    exif = Image.Exif()
    exif[305] = "fastslow-simulator 1.0"
    im.save(tagged, exif=exif.tobytes(), **({"comment": "fastslow-simx"} if fmt in ("jpg", "gif")
                                              else {}))  # fmt: skip
    fig = plt.figure()
    fig.savefig(tmp_path / f"mpl.{fmt}")
    for path in (plain, tagged, tmp_path / f"mpl.{fmt}"):
        assert not written_by_us(path), path
        with pytest.raises(fs.InputError, match="never replaced"):
            save_figure(plt.figure(), path)


def _foreign_svg(path):
    path.write_text('<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"></svg>\n')


def test_the_sniffers(tmp_path):
    """Marks are read from the content, never the name; anything corrupt is not ours."""
    ds = xr.Dataset({"x": ("t", np.arange(3))})
    fs.save_dataset(ds, tmp_path / "ours.txt")  # a name says nothing
    assert written_by_us(tmp_path / "ours.txt")
    _foreign_svg(tmp_path / "f.svg")
    with gzip.open(tmp_path / "f.svgz", "wb") as f:
        f.write((tmp_path / "f.svg").read_bytes())
    (tmp_path / "f.pdf").write_bytes(b"%PDF-1.4\n% fastslow-sim\n/Creator (someone)\n%%EOF\n")
    (tmp_path / "f.eps").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%Creator: someone\n")
    torch.save({"model": torch.zeros(2)}, tmp_path / "f.pt")
    (tmp_path / "f.json").write_text(json.dumps({"a": 1, "fastslow_sim_version": "0"}))
    cut = (tmp_path / "ours.txt").read_bytes()[:100]  # truncated HDF5, corrupt PNG and zip
    (tmp_path / "cut.nc").write_bytes(cut)
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\xff" * 40)
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04garbage")
    (tmp_path / "bad.svgz").write_bytes(b"\x1f\x8bgarbage")
    for name in ["f.svg", "f.svgz", "f.pdf", "f.eps", "f.pt", "f.json", "cut.nc", "bad.png",
                 "bad.pt", "bad.svgz"]:  # fmt: skip
        assert not written_by_us(tmp_path / name), name
    save_json({"a": 1}, tmp_path / "s.json")
    assert written_by_us(tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text())["a"] == 1


def test_an_old_json_file_counts_in_a_run_folder_of_ours(tmp_path):
    # summary.json and phi_vs_pst.json written before the mark: ours beside our checkpoint
    old = tmp_path / "summary.json"
    old.write_text(json.dumps({"variant": "coupled"}))
    assert not written_by_us(old)
    torch.save({"model": torch.zeros(2)}, tmp_path / "ckpt.pt")
    assert not written_by_us(old)  # a checkpoint, but not fastslow-sim's
    torch.save({"model": torch.zeros(2), "fastslow_sim_version": "0.1"}, tmp_path / "ckpt.pt")
    assert written_by_us(tmp_path / "ckpt.pt") and written_by_us(old)


@pytest.mark.parametrize("name, content, ours", [
    ("phi_vs_pst.json", '{"mine": 1}', False), ("summary.json", '{"mine": 1}', False),
    ("phi_vs_pst.json", '[1, 2]', False), ("summary.json", '{"run": "x"}', False),
    ("phi_vs_pst.json", '{"run": "r", "variant": "coupled"}', True),
    ("summary.json", ' { "variant" : "dense"}', True),
])  # fmt: skip
def test_an_unmarked_json_beside_our_checkpoint_is_ours_only_as_ours_began(tmp_path, name,
                                                                           content, ours):
    # a user's {"mine": 1} saved as phi_vs_pst.json in a run folder was replaced by phi-vs-pst
    torch.save({"model": torch.zeros(2), "fastslow_sim_version": "0.1"}, tmp_path / "ckpt.pt")
    (tmp_path / name).write_text(content)
    assert written_by_us(tmp_path / name) is ours


def test_phi_vs_pst_refuses_a_users_json_in_the_run_folder(tmp_path):
    from fastslow_sim.probe import phi_vs_pst
    from fastslow_sim.training import TrainConfig, train

    run = tmp_path / "run"
    train(TrainConfig(corpus="me:tokens=20k", out=str(run), tokens=512, block_size=16,
                      batch_size=4, n_layer=1, n_head=2, n_embd=32, P=4, eval_interval=4,
                      eval_batches=2, ckpt_interval=4, warmup_steps=2, progress=False))  # fmt: skip
    mine = run / "phi_vs_pst.json"
    mine.write_text('{"mine": 1}')
    with pytest.raises(fs.InputError, match="phi_vs_pst.json.*never replaced"):
        phi_vs_pst(run)
    assert mine.read_text() == '{"mine": 1}'


def test_the_committed_figures_are_ours():
    files = sorted(FIGURES.glob("*.png")) + sorted(FIGURES.glob("*.pdf"))
    assert len(files) >= 20
    assert [f.name for f in files if not written_by_us(f)] == []


def test_figures_regenerate_over_the_committed_ones(tmp_path):
    out = tmp_path / "figures"
    shutil.copytree(FIGURES, out)
    kw = {"out": out, "results": tmp_path / "res", "runs": tmp_path / "runs", "sizes": TINY,
          "progress": False, "text": None}  # fmt: skip
    before = [(out / f"integrate-birth-death.{s}").stat().st_ino for s in ("png", "pdf")]
    rec = gallery.make_figures(only="integrate-birth-death", **kw)
    assert len(rec[0]["files"]) == 2  # both replaced (renamed onto: new inodes)
    after = [(out / f"integrate-birth-death.{s}").stat().st_ino for s in ("png", "pdf")]
    assert after[0] != before[0] and after[1] != before[1]
    # a file of the user's among them: refused before any dataset is computed
    _text(out / "convergence.pdf")
    with pytest.raises(fs.InputError, match="convergence.pdf' holds a file that fastslow-sim"):
        gallery.make_figures(only="convergence", **kw)
    assert not (tmp_path / "res" / "convergence.nc").exists()


def test_a_foreign_dataset_among_the_results_is_refused_before_computing(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    _text(res / "integrate-birth-death.nc")
    with pytest.raises(fs.InputError, match="integrate-birth-death.nc' holds a file that"):
        gallery.make_figures(only="integrate-birth-death", out=tmp_path / "figs", results=res,
                             runs=tmp_path / "runs", sizes=TINY, progress=False, text=None)  # fmt: skip
    assert (res / "integrate-birth-death.nc").read_text() == "my notes\n"
    assert not (tmp_path / "figs").exists()


def test_a_foreign_dataset_of_a_later_figure_is_refused_before_the_first_is_made(tmp_path):
    """cost.nc is the last figure's dataset (after hours of training at the full sizes): a file
    of the user's there is refused before any figure's dataset is computed."""
    res = tmp_path / "res"
    res.mkdir()
    _text(res / "cost.nc")
    with pytest.raises(fs.InputError, match="cost.nc' holds a file that"):
        gallery.make_figures(only="integrate-birth-death,cost", out=tmp_path / "figs",
                             results=res, runs=tmp_path / "runs", sizes=TINY, progress=False,
                             text=None)  # fmt: skip
    assert sorted(p.name for p in res.iterdir()) == ["cost.nc"]
    assert (res / "cost.nc").read_text() == "my notes\n" and not (tmp_path / "figs").exists()


@pytest.mark.parametrize("name", ["summary.json", "train.nc", "ckpt.pt"])
def test_train_refuses_a_foreign_file_in_its_folder_before_training(name, tmp_path):
    from test_training import TINY as TRAIN_TINY

    from fastslow_sim.training import TrainConfig, train

    out = tmp_path / "run"
    out.mkdir()
    _text(out / name)
    with pytest.raises(fs.InputError, match=f"{name}' holds a file that fastslow-sim did not"):
        train(TrainConfig(corpus="random", tokens=256, out=str(out), **TRAIN_TINY))
    assert sorted(p.name for p in out.iterdir()) == [name]
    assert (out / name).read_text() == "my notes\n"


# --- from a review (helper-17): the edges of the rule -------------------------------------------


def _integrate(out, tmp_path, monkeypatch):
    return invoke(["integrate", "--eps", "0.125", "--t-end", "0.5", "--no-plot", "--out", str(out)],
                  tmp_path, monkeypatch)  # fmt: skip


def test_a_mark_that_only_begins_like_ours_is_not_ours(tmp_path, monkeypatch):
    target = tmp_path / "acme.png"
    Image.new("RGB", (4, 4)).save(target, format="png", pnginfo=_png_info("fastslow-simulator 2"))
    before = target.read_bytes()
    res = invoke(["integrate", "--eps", "0.1", "--t-end", "0.5", "--plot", str(target), "--out",
                  str(tmp_path / "r.nc")], tmp_path, monkeypatch)  # fmt: skip
    _refused(res, target, before)


def _png_info(software):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Software", software)
    return info


def test_a_json_of_the_users_beside_a_checkpoint_of_ours_is_not_ours(tmp_path, monkeypatch):
    # only the names a run folder of ours holds count as ours there, not any JSON file
    run = tmp_path / "run"
    run.mkdir()
    torch.save({fs.io.VERSION_KEY: "0", "model": {}}, run / "ckpt.pt")
    (run / "summary.json").write_text('{"variant": "coupled", "train_config": {}}')
    notes = run / "notes.json"
    notes.write_text('{"my": "notes"}')
    assert written_by_us(run / "summary.json") and not written_by_us(notes)
    res = _integrate(notes, tmp_path, monkeypatch)
    _refused(res, notes, b'{"my": "notes"}')


def test_a_read_only_file_of_ours_is_not_replaced(tmp_path, monkeypatch):
    out = tmp_path / "r.nc"
    assert _integrate(out, tmp_path, monkeypatch).exit_code == 0
    out.chmod(0o444)
    before = out.read_bytes()
    res = _integrate(out, tmp_path, monkeypatch)
    assert res.exit_code == 2 and "read-only" in res.output and res.output.count("\n") == 1
    assert out.read_bytes() == before


def test_names_too_long_and_loops_of_links_are_one_sentence_before_any_work(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(fs.integrators, "integrate", lambda *a, **k: calls.append(1))
    long = tmp_path / ("a" * 245 + ".nc")  # 248 bytes: fits, but its temporary name would not
    res = _integrate(long, tmp_path, monkeypatch)
    assert res.exit_code == 2 and "has a file name of 248 bytes" in res.output
    loop = tmp_path / "loop.nc"
    loop.symlink_to(loop.name)
    res = _integrate(loop, tmp_path, monkeypatch)
    assert res.exit_code == 2 and "Too many levels of symbolic links" in res.output
    assert res.output.count("\n") == 1 and not calls


def test_a_file_operation_that_fails_after_the_checks_is_one_sentence(tmp_path, monkeypatch):
    # a rename the file system refuses (an immutable file, another user's file in /tmp), a
    # full disk: exit status 1 and one sentence, not a traceback
    def refuse(src, dst):
        raise PermissionError(1, "Operation not permitted", str(src), None, str(dst))

    monkeypatch.setattr(fs.io.os, "replace", refuse)
    res = _integrate(tmp_path / "r.nc", tmp_path, monkeypatch)
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines()[-1] == (
        f"Error: a file operation failed on {str(tmp_path / 'r.nc')!r}: Operation not permitted.")
    assert not list(tmp_path.glob("*.part"))


def test_a_checkpoint_is_never_unpickled_beyond_tensors_and_plain_data(tmp_path):
    # a foreign ckpt.pt in a run folder: reading its configuration must not run its code
    from fastslow_sim.training import _held_config

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"train_config": Payload()}, run / "ckpt.pt")
    assert _held_config(run) is None and not (tmp_path / "ran").exists()


def test_a_file_reaches_the_disk_before_its_name(tmp_path, monkeypatch):
    """`atomic_path` renamed the temporary file onto the target without flushing it: after a
    crash the new name could point to a file without its bytes. Now the file is flushed
    (fsync) before the rename, and its folder after it."""
    from fastslow_sim import io as fio

    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append(("fsync", os.readlink(
        f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])  # fmt: skip
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append(("replace", str(b))),
                                                     real_replace(a, b))[1])  # fmt: skip
    out = tmp_path / "s.json"
    fio.save_json({"a": 1}, out)
    assert [k for k, _ in order] == ["fsync", "replace", "fsync"]
    assert order[0][1].startswith(str(tmp_path / ".s.json."))  # the temporary file
    assert order[1:] == [("replace", str(out)), ("fsync", str(tmp_path))]


def test_a_sweep_cell_with_list_attributes_round_trips(tmp_path, monkeypatch):
    """One cell of a sweep store (root attributes `swept`, `batched_axes`: lists of strings)
    ended in h5py's raw TypeError (no conversion path for dtype('<U3')); the store's path ends
    in a separator, which a folder output takes (`check_file_name` is for files only)."""
    res = invoke(["sweep", "integrate", "--grid", "eps=0.1,0.05,0.02", "--store", "s.zarr/",
                  "--workers", "0", "--t-end", "0.05", "--n-eval", "5"], tmp_path, monkeypatch)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s.zarr").is_dir()
    ds = xr.open_zarr(tmp_path / "s.zarr").load()
    ds.attrs["swept"] = ["eps", "P"]  # two entries: one alone reads back as a string (netCDF's)
    cell = ds.isel(eps=0)
    back = fs.load_dataset(fs.save_dataset(cell, tmp_path / "cell.nc"))
    assert back.attrs["swept"] == ["eps", "P"]
    assert back.attrs["batched_axes"] == list(ds.attrs["batched_axes"])
    with xr.open_dataset(tmp_path / "cell.nc", engine="h5netcdf") as plain:
        assert plain.attrs["batched_axes"] == list(ds.attrs["batched_axes"])
    assert written_by_us(tmp_path / "cell.nc")
    strings = xr.Dataset({"a": ("t", [1.0])}, attrs={"names": np.array(["a", "bb"]), "n": [1, 2],
                                                     "flags": [True, False]})  # fmt: skip
    back = fs.load_dataset(fs.save_dataset(strings, tmp_path / "s.nc"))
    assert back.attrs["names"] == ["a", "bb"]
    assert back.attrs["n"].tolist() == [1, 2] and back.attrs["flags"].tolist() == [1, 0]


@pytest.mark.parametrize("attrs, var, said", [
    ({"meta": {"a": 1}}, None, "the dataset attribute 'meta' is a dict, {'a': 1}, which"),
    ({"meta": ["a", None]}, None, "the dataset attribute 'meta' is a list, ['a', None], which"),
    ({"meta": [1, "a"]}, None, "the dataset attribute 'meta' is a list, [1, 'a'], which"),
    ({"meta": object()}, None, "the dataset attribute 'meta' is an object, <object object"),
    ({"units": {"s": 1}}, "a", "the attribute 'units' of the dataset variable 'a' is a dict"),
])  # fmt: skip
def test_an_attribute_netcdf_cannot_hold_is_one_sentence_before_any_file(attrs, var, said,
                                                                          tmp_path):
    ds = xr.Dataset({"a": ("t", [1.0])})
    (ds if var is None else ds[var]).attrs.update(attrs)
    with pytest.raises(fs.InputError) as err:
        fs.save_dataset(ds, tmp_path / "x.nc")
    text = str(err.value)
    assert text.startswith(said) and "\n" not in text, text
    assert text.endswith("expected a string, a number (an integer within 64 bits), or a list of "
                         "only numbers or only strings.")  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # no file, no temporary file


@pytest.mark.parametrize("args, said", [
    (["integrate", "--eps", "0.1", "--t-end", "0.1", "--out", "nd/", "--no-plot"],
     "Error: the dataset path 'nd/' names a folder; expected a file name such as nd/dataset.nc.\n"),
    (["convergence", "--out", "cvdir/", "--no-plot"],
     "Error: the dataset path 'cvdir/' names a folder; expected a file name such as "
     "cvdir/dataset.nc.\n"),
    (["integrate", "--eps", "0.1", "--t-end", "0.1", "--out", "r.nc", "--plot", "pldir/"],
     "Error: the plot path 'pldir/' names a folder; expected a file name such as pldir/plot.png.\n"),
])  # fmt: skip
def test_an_output_file_path_ending_in_a_separator_is_refused(args, said, tmp_path, monkeypatch):
    """`--out nd/` wrote an HDF5 file named nd (exit 0); `--plot pldir/` a PNG named pldir."""
    res = invoke(args, tmp_path, monkeypatch)
    assert res.exit_code == 2 and res.output == said, res.output
    assert list(tmp_path.iterdir()) == []  # refused before the work


def test_the_file_writers_refuse_a_path_ending_in_a_separator(tmp_path):
    ds = xr.Dataset({"a": ("t", [1.0])})
    for write in (lambda p: fs.save_dataset(ds, p), lambda p: save_figure(plt.figure(), p),
                  lambda p: save_json({"a": 1}, p)):  # fmt: skip
        with pytest.raises(fs.InputError, match="names a folder; expected a file name"):
            write(f"{tmp_path}{os.sep}d{os.sep}")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "d").mkdir()  # `d/.` is `d` to Path: the file had taken the folder's name
    for name in (".", ".."):
        with pytest.raises(fs.InputError, match=re.escape(
                f"names a folder; expected a file name such as "
                f"{os.path.normpath(tmp_path / 'd' / name)}{os.sep}dataset.nc.")):  # fmt: skip
            fs.save_dataset(ds, f"{tmp_path / 'd'}{os.sep}{name}")
    assert [p.name for p in tmp_path.rglob("*")] == ["d"]


def test_a_list_of_one_string_reads_back_as_a_list(tmp_path):
    """NetCDF reads a list of one string back as the string: a one-axis sweep cell's
    `swept=['eps']` came back 'eps' (and zip over it gave 'e'); the attribute is restored."""
    ds = xr.Dataset({"a": ("t", [1.0], {"u": ["x"]})}, attrs={"swept": ["eps"], "two": ["a", "b"],
                                                              "plain": "eps"})  # fmt: skip
    back = fs.load_dataset(fs.save_dataset(ds, tmp_path / "one.nc"))
    assert (back.attrs["swept"], back.attrs["two"], back.attrs["plain"]) == (["eps"], ["a", "b"], "eps")
    assert back["a"].attrs["u"] == ["x"] and "fastslow_sim_string_lists" not in back.attrs
    again = fs.load_dataset(fs.save_dataset(back, tmp_path / "again.nc"))  # saved twice
    assert again.attrs["swept"] == ["eps"] and again["a"].attrs["u"] == ["x"]


def test_a_truncated_dataset_of_ours_is_called_unreadable_not_someone_elses(tmp_path,
                                                                            monkeypatch):
    """A .nc file of ours cut short (`head -c 2000`) was refused as a file "that fastslow-sim
    did not write"; what shows is only that it cannot be read."""
    args = ["integrate", "--eps", "0.1", "--t-end", "0.1", "--out", "r.nc", "--no-plot"]
    assert invoke(args, tmp_path, monkeypatch).exit_code == 0
    out = tmp_path / "r.nc"
    out.write_bytes(out.read_bytes()[:2000])
    res = invoke(args, tmp_path, monkeypatch)
    _refused(res, out, out.read_bytes())
    assert res.output == ("Error: the dataset path 'r.nc' holds a file that cannot be read (damaged "
                          "or cut short), so nothing shows who wrote it, and it is never replaced: "
                          "remove it or choose another path.\n")  # fmt: skip
