"""User errors cross process boundaries: every `ComoeError` class pickles and unpickles to the
same class, message and attributes (a worker process hands its error to the parent this way).

The classes are found by importing every module of the package and walking the subclasses,
so an error class added later is covered without touching this file.
"""

from __future__ import annotations

import importlib
import pickle
import pkgutil
import types
import typing
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import comoe_opt
from comoe_opt.errors import ComoeError, InputError

# modules that subclass an engine's class and import only where that engine is installed
NEEDS_AN_ENGINE = {"comoe_opt.balancers.dropin.vllm_policy"}


def _all_modules() -> list[str]:
    """Every module of the package but `__main__`s (importing one runs the command) and those that
    need an engine installed."""
    found = pkgutil.walk_packages(comoe_opt.__path__, prefix="comoe_opt.")
    return [m.name for m in found if not m.name.endswith("__main__") and m.name not in NEEDS_AN_ENGINE]


def _error_classes() -> list[type[ComoeError]]:
    for name in _all_modules():
        importlib.import_module(name)
    seen: list[type[ComoeError]] = []
    todo: list[type[ComoeError]] = [ComoeError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("comoe_opt") and cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return sorted(seen, key=lambda c: c.__qualname__)


ERRORS = _error_classes()


def _value(annotation: Any) -> st.SearchStrategy[Any]:
    """Random values of a constructor parameter: text, a path, or None where the hints allow."""
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    out: list[st.SearchStrategy[Any]] = []
    for option in options:
        if option is type(None):
            out.append(st.none())
        elif option is Path:
            out.append(st.text(min_size=1).map(Path))
        elif option is int:
            out.append(st.integers())
        else:
            out.append(st.text())
    return st.one_of(out)


@st.composite
def _errors(draw: st.DrawFn) -> ComoeError:
    """One instance of a random error class, built from random constructor arguments."""
    cls = draw(st.sampled_from(ERRORS))
    if cls.__init__ is Exception.__init__:  # Exception's own constructor: messages
        return cls(*draw(st.lists(st.text(), min_size=1, max_size=3)))
    hints = typing.get_type_hints(cls.__init__)
    hints.pop("return", None)
    return cls(**{name: draw(_value(hint)) for name, hint in hints.items()})


def test_every_error_class_is_found() -> None:
    assert ComoeError in ERRORS and InputError in ERRORS
    assert all(issubclass(cls, ComoeError) for cls in ERRORS)


@given(_errors())
def test_every_error_round_trips_through_pickle(exc: ComoeError) -> None:
    exc.add_note("a note added on the way")  # notes live in __dict__: they travel too
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc) and back.args == exc.args
    assert vars(back) == vars(exc)


@given(st.one_of(st.none(), st.text()), st.one_of(st.none(), st.text()), st.text())
def test_input_error_keeps_its_fields(source: str | None, field: str | None, problem: str) -> None:
    exc = InputError(source, field, problem)
    back = pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
    assert (back.source, back.field, back.problem) == (source, field, problem)


def test_input_error_message_by_hand() -> None:
    exc = InputError(Path("inst.toml"), "model.layers", "must be >= 1, got 0")
    back = pickle.loads(pickle.dumps(exc))
    assert str(back) == "inst.toml: model.layers: must be >= 1, got 0"
    assert back.source == "inst.toml" and back.field == "model.layers"


class _KeywordOnlyError(ComoeError):
    """A subclass whose constructor takes neither its message nor positional arguments."""

    def __init__(self, *, count: int):
        self.count = count
        super().__init__(f"{count} things are wrong")


def test_a_subclass_with_its_own_constructor_round_trips() -> None:
    back = pickle.loads(pickle.dumps(_KeywordOnlyError(count=3)))
    assert isinstance(back, _KeywordOnlyError) and back.count == 3 and str(back) == "3 things are wrong"
