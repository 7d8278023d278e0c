"""Unit tests do no real I/O: the tripwire below fails any test under tests/unit that opens a
network connection (or a listening socket) or starts a process, and promtool is missing here
(the engine's rule checks then skip PromQL, as they do on a machine without promtool).

A test of a real HTTP server, a real receiver or a real process is an integration test: it
belongs in ``tests/integration/<subsystem>/``. Anything else hands the code the fakes at our
own boundary (``tests/builders.py``, ``tests/fakes/``). There is no marker to switch the
tripwire off; a module that had to could define a fixture of its own named ``no_real_io``
(pytest's nearer definition wins), and should say why.

What trips: ``connect``, ``connect_ex`` and ``bind`` of an IPv4, IPv6 or Unix socket (a
``socketpair``, as an event loop makes, does not), and starting a process by ``subprocess``,
``os.fork``/``forkpty``/``posix_spawn``/``system`` or ``multiprocessing``. The test fails with
what was asked and what to do, also when the code under test caught the tripwire's error.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from gpuops.offline import promtool

ADVICE = (
    "unit tests open no network connection and start no process: move this test to "
    "tests/integration/<subsystem>/ if it tests a real server or process, or hand the code "
    "the fake (tests/builders.py, tests/fakes/)"
)

NETWORK = (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX)


class RealIOError(AssertionError):
    """What the tripwire raises; reported again when the test ends if the code under test
    caught it."""


CALL_FAILURE = pytest.StashKey[str]()
"""The text of the test's own failure, if it failed."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILURE] = report.longreprtext
    return report


@pytest.fixture(autouse=True)
def no_real_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    tripped: list[str] = []

    def refuse(what: str) -> RealIOError:
        message = f"{request.node.nodeid}: {what}; {ADVICE}"
        tripped.append(message)
        return RealIOError(message)

    def on_socket(name: str) -> Callable[..., Any]:
        real = getattr(socket.socket, name)

        def wrapped(self: socket.socket, address: Any, *args: Any) -> Any:
            if self.family in NETWORK:
                raise refuse(f"socket.{name}({address!r})")
            return real(self, address, *args)

        return wrapped

    def on_process(name: str, shown: int = 0) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            command = args[shown] if len(args) > shown else ""
            raise refuse(f"{name}({command!r}) would start a process")

        return wrapped

    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, on_socket(name))
    monkeypatch.setattr(subprocess.Popen, "_execute_child", on_process("subprocess.Popen", shown=1))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", on_process("_posixsubprocess.fork_exec"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        monkeypatch.setattr(os, name, on_process(f"os.{name}"))
    monkeypatch.setattr(promtool, "find_promtool", _promtool_missing)
    yield
    if tripped and RealIOError.__name__ not in request.node.stash.get(CALL_FAILURE, ""):
        pytest.fail("\n".join(dict.fromkeys(tripped)), pytrace=False)  # caught on its way


def _promtool_missing() -> str:
    raise promtool.PromtoolError(
        "promtool is not run by unit tests (tests/unit/conftest.py): PromQL was not checked; "
        "tests/integration checks it with promtool"
    )
