"""How long calls behave in an interpreter: the GIL is released, Ctrl-C
stops them through the engine's cancellation, a progress bar shows; and the
API is documented and typed (docstrings, complete stubs)."""

import _thread
import ast
import inspect
import pathlib
import threading
import time

import pytest

import lcut
from conftest import BUNDLED

PROMPTS = [f"copy : with by [ castle eagle horse cake ] by that {i}" for i in range(4000)]


def test_long_calls_release_the_gil(bundled):
    worker = threading.Thread(target=lambda: bundled.diagnose(PROMPTS[:300], max_new_tokens=8, progress=False))
    worker.start()
    time.sleep(0.1)
    count, until = 0, time.monotonic() + 0.3
    while time.monotonic() < until:
        count += 1
    # Python ran here while the engine worked in the other thread
    assert worker.is_alive(), "the run ended before the check: give it more prompts"
    assert count > 10_000, count
    worker.join()


def test_ctrl_c_stops_a_long_call_and_leaves_the_session_usable(bundled):
    timer = threading.Timer(0.5, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        bundled.diagnose(PROMPTS, max_new_tokens=8, progress=False)
    stopped = time.monotonic() - started
    timer.join()
    # the whole run takes minutes; it stopped at the next step
    assert stopped < 5.0, stopped
    g = bundled.generate(PROMPTS[0], policy="full", max_new_tokens=4, progress=False)
    assert len(g.ids) >= 1


def test_a_progress_bar_shows_when_tqdm_is_installed(bundled, capsys):
    pytest.importorskip("tqdm")
    bundled.trace(PROMPTS[0], max_new_tokens=4, progress=True)
    assert "trace" in capsys.readouterr().err
    bundled.trace(PROMPTS[0], max_new_tokens=4, progress=False)
    assert "trace" not in capsys.readouterr().err


def test_help_reads_well():
    doc = lcut.load.__doc__
    for part in ["Args:", "dtype", "Raises:", "FileNotFoundError", ".gguf"]:
        assert part in doc, part
    assert str(inspect.signature(lcut.load)) == "(path=None, dtype='f32', lora=None, device='cpu')"
    sig = inspect.signature(lcut.Session.generate)
    assert sig.parameters["policy"].default == "speed:3/4+bos"
    assert sig.parameters["compare"].default is None
    for cls in [lcut.Session, lcut.Trace, lcut.Report, lcut.Generation, lcut.Forward, lcut.ModelConfig]:
        assert cls.__doc__ and len(cls.__doc__) > 40, cls
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                assert member.__doc__, f"{cls.__name__}.{name} has no docstring"


def stub_names() -> dict:
    """Names the stub file declares: module level, and per class."""
    stub = pathlib.Path(lcut.__file__).with_name("_lcut.pyi")
    tree = ast.parse(stub.read_text())
    out = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign):
                    members.add(item.target.id)
            out[node.name] = members
            out[""].add(node.name)
        elif isinstance(node, ast.FunctionDef):
            out[""].add(node.name)
        elif isinstance(node, ast.AnnAssign):
            out[""].add(node.target.id)
    return out


def test_the_stubs_declare_every_public_name():
    assert (pathlib.Path(lcut.__file__).parent / "py.typed").exists()
    stubs = stub_names()
    from lcut import _lcut

    public = {n for n in dir(_lcut) if not n.startswith("_")} | {"__version__"}
    assert public <= stubs[""], public - stubs[""]
    for cls in [lcut.Session, lcut.Trace, lcut.Report, lcut.Generation, lcut.Forward, lcut.ModelConfig]:
        members = {n for n in dir(cls) if not n.startswith("_")}
        assert members <= stubs[cls.__name__], (cls.__name__, members - stubs[cls.__name__])


def test_the_errors_are_python_builtins_too():
    assert issubclass(lcut.InvalidInputError, ValueError)
    assert issubclass(lcut.NotFoundError, FileNotFoundError)
    assert issubclass(lcut.InvalidInputError, lcut.LcutError)
    assert lcut.load(BUNDLED).config.layers == 4
