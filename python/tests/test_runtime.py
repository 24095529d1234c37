"""How long calls behave in an interpreter: the GIL is released, Ctrl-C
stops them through the engine's cancellation, a progress bar shows; and the
API is documented and typed (docstrings, complete stubs); the import keeps
the prefill's buffers in the heap as the binary does."""

import _thread
import ast
import inspect
import os
import pathlib
import platform
import signal
import subprocess
import sys
import threading
import time
import types

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


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt during the test, as in an interactive
    interpreter. A Python started with SIGINT ignored (a background job of a
    non-interactive shell, nohup: how CI runners often start their scripts)
    installs no KeyboardInterrupt handler, and then `_thread.interrupt_main`
    does nothing at all."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class CtrlCBar:
    """A stand-in for tqdm's bar that presses Ctrl-C from inside the run:
    `press` is called at the bar's first update, on the calling thread.
    Counts the prompts the run finished."""

    press = staticmethod(lambda: None)

    def __init__(self, total=None, **_):
        self.total, self.done, self.pressed = total, 0, False
        CtrlCBar.last = self

    def _first_call(self):
        if not self.pressed:
            self.pressed = True
            CtrlCBar.press()

    def update(self, n):
        self.done += n
        self._first_call()

    def set_postfix_str(self, note):
        self._first_call()

    def close(self):
        pass


@pytest.fixture
def ctrl_c_bar(monkeypatch, sigint_raises):
    """tqdm.auto replaced by a module whose bar is `CtrlCBar`."""
    fake = types.ModuleType("tqdm.auto")
    fake.tqdm = CtrlCBar
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake)
    return CtrlCBar


def ctrl_c_stops_the_run_and_leaves_the_session_usable(bundled, most_done):
    with pytest.raises(KeyboardInterrupt):
        bundled.diagnose(PROMPTS, max_new_tokens=8, progress=True)
    bar = CtrlCBar.last
    assert bar.pressed
    # it stopped at a callback soon after, not at the end of the prompts
    assert bar.done <= most_done, (bar.done, bar.total)
    g = bundled.generate(PROMPTS[0], policy="full", max_new_tokens=4, progress=False)
    assert len(g.ids) >= 1


def test_ctrl_c_in_the_progress_callback_stops_the_call(bundled, ctrl_c_bar, monkeypatch):
    # the interrupt is raised in the bar's own Python code, or seen by the
    # next callback's signal check: either way the run stops there
    monkeypatch.setattr(ctrl_c_bar, "press", staticmethod(_thread.interrupt_main))
    # pressed as the first prompt starts: no prompt finishes
    ctrl_c_stops_the_run_and_leaves_the_session_usable(bundled, most_done=0)


def test_ctrl_c_while_the_engine_computes_stops_the_call(bundled, ctrl_c_bar, monkeypatch):
    # another thread presses Ctrl-C once it gets the GIL, which the engine
    # releases while it computes; the signal is always handled on the main
    # thread (the only one Python runs signal handlers on), at the engine's
    # next callback
    presser = threading.Thread(target=_thread.interrupt_main)
    monkeypatch.setattr(ctrl_c_bar, "press", staticmethod(presser.start))
    try:
        # the thread runs within a few steps; the run would take minutes
        ctrl_c_stops_the_run_and_leaves_the_session_usable(bundled, most_done=len(PROMPTS) // 10)
    finally:
        presser.join()


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
    for cls in [lcut.Session, lcut.Trace, lcut.Routing, lcut.Report, lcut.Generation, lcut.Forward, lcut.ModelConfig]:
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
    for cls in [lcut.Session, lcut.Trace, lcut.Routing, lcut.Report, lcut.Generation, lcut.Forward, lcut.ModelConfig]:
        members = {n for n in dir(cls) if not n.startswith("_")}
        assert members <= stubs[cls.__name__], (cls.__name__, members - stubs[cls.__name__])


def test_the_errors_are_python_builtins_too():
    assert issubclass(lcut.InvalidInputError, ValueError)
    assert issubclass(lcut.NotFoundError, FileNotFoundError)
    assert issubclass(lcut.InvalidInputError, lcut.LcutError)
    assert lcut.load(BUNDLED).config.layers == 4


def test_the_import_keeps_freed_buffers_unless_told_not_to(tmp_path):
    # glibc is told at import to keep the prefill's MiB-sized buffers in its
    # heap, as the lcut binary does; LCUT_KEEP_FREED_BUFFERS=0 leaves it be
    def imported(**env):
        out = subprocess.run(
            [sys.executable, "-c", "import lcut; print(lcut.KEEPS_FREED_BUFFERS)"],
            env={**os.environ, **env},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert imported() == str(glibc)
    assert imported(LCUT_KEEP_FREED_BUFFERS="0") == "False"
