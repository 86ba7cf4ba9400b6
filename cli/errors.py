"""How every ``hfai`` command ends on an error a user can cause: one line ``Error: ...`` on stderr
and status 1, never a traceback. The text goes through :func:`hfai.cli.render.clean` (it may quote
a name or reason somebody else chose: it must not drive the terminal). Ctrl-C ends with 130, and a
reader that went away (``hfai ps | head -3``) ends it quietly with 141, as SIGPIPE ends ``cat``.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar, overload

import click

from hfai.cli import render
from hfai.protocol.errors import HfaiError

P = ParamSpec("P")
R = TypeVar("R")

Kinds = Callable[[], tuple[type[BaseException], ...]]


def _hfai_errors() -> tuple[type[BaseException], ...]:
    return (HfaiError,)


class _Decorator(Protocol):
    """What :func:`user_errors` makes: it keeps a command's parameters; an async command becomes a
    plain function returning what the coroutine returns."""

    @overload
    def __call__(self, command: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, R]: ...
    @overload
    def __call__(self, command: Callable[P, R]) -> Callable[P, R]: ...


def user_errors(kinds: Kinds = _hfai_errors) -> _Decorator:
    """Decorate a command: the errors ``kinds()`` names (default: HfaiError; a function, so a
    command group may name errors of a module it imports only when it runs) become ``Error: ...``.
    An ``async def`` command is run with ``asyncio.run``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        def run_async(*args: Any, **kwargs: Any) -> Any:
            # asyncio here, not at import: a command's help, or a command that runs no coroutine,
            # does without it.
            import asyncio

            return asyncio.run(command(*args, **kwargs))

        run = run_async if inspect.iscoroutinefunction(command) else command

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return run(*args, **kwargs)
            except BrokenPipeError:
                _reader_gone()
            except KeyboardInterrupt:
                sys.exit(130)
            except Exception as e:
                if isinstance(e, kinds()) and not isinstance(e, click.ClickException):
                    raise click.ClickException(render.clean(str(e))) from None
                raise

        return wrapper

    return decorate


def _reader_gone() -> None:
    # Nothing went wrong that is worth a message. Stop as cat does when SIGPIPE kills it, and point
    # stdout at /dev/null so the interpreter's last flush cannot complain either.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)
