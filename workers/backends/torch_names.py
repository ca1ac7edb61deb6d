"""Which config tensor is which argument and which result of a TorchScript ``forward``.

TorchScript tensors have positions, not names, so a config's names are matched to them by
Triton's PyTorch backend conventions, chosen by the config's ``input`` names (inputs) and
``output`` names (outputs):

- inputs: when every input name is one of ``forward``'s argument names, each goes to its
  argument (*forward argument*); else, when every name reads ``<name>__<index>``, each goes
  to position ``<index>`` (*named index*); else they go in config order (*config order*);
- outputs: when every output name reads ``<name>__<index>``, each is result ``<index>``;
  else they are taken in config order.

A stateful model's control and state inputs (and its state outputs) follow the same
convention as the config's own, after them in config order. Pure logic: no torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from plaza.errors import ConfigError

FORWARD_ARGUMENT = "forward argument"
NAMED_INDEX = "named index"
CONFIG_ORDER = "config order"


def named_index(name: str) -> int | None:
    """``<index>`` of a name that reads ``<name>__<index>`` (after its first ``__``, digits
    only); None otherwise."""
    at = name.find("__")
    rest = name[at + 2 :] if at >= 0 else ""
    return int(rest) if rest.isdigit() else None


def input_convention(names: Sequence[str], forward_args: Sequence[str] | None) -> str:
    """How the config's input ``names`` map to ``forward``'s arguments (None: not known)."""
    if names and forward_args is not None and all(n in forward_args for n in names):
        return FORWARD_ARGUMENT
    if names and all(named_index(n) is not None for n in names):
        return NAMED_INDEX
    return CONFIG_ORDER


def argument_order(
    model: str, inputs: Sequence[str], extras: Sequence[str], forward_args: Sequence[str] | None
) -> list[str]:
    """The names ``forward`` takes, in its argument order: the config's ``inputs`` and the
    ``extras`` after them (a stateful model's control and state inputs). ConfigError when a
    name has no place under the convention, or the places are not 0 to n-1 each once."""
    names = [*inputs, *extras]
    kind = input_convention(inputs, forward_args)
    if kind == CONFIG_ORDER:
        return names
    places: dict[str, int] = {}
    for name in names:
        if kind == FORWARD_ARGUMENT:
            place = forward_args.index(name) if forward_args and name in forward_args else None
        else:
            place = named_index(name)
        if place is None:
            raise ConfigError(
                f"{model}: input {name!r} has no argument of forward under the {kind} "
                f"convention the config's inputs follow ({list(inputs)})"
            )
        places[name] = place
    return _ordered(model, "input", places, kind)


def result_order(model: str, outputs: Sequence[str], extras: Sequence[str]) -> dict[str, int]:
    """Each output's position in ``forward``'s results: the config's ``outputs`` and the
    ``extras`` (a stateful model's state outputs) after them. ConfigError as for inputs."""
    names = [*outputs, *extras]
    if not (outputs and all(named_index(n) is not None for n in outputs)):
        return {name: i for i, name in enumerate(names)}
    places: dict[str, int] = {}
    for name in names:
        place = named_index(name)
        if place is None:
            raise ConfigError(
                f"{model}: output {name!r} does not read <name>__<index>, as the config's "
                f"outputs do ({list(outputs)})"
            )
        places[name] = place
    _ordered(model, "output", places, NAMED_INDEX)
    return places


def _ordered(model: str, kind: str, places: dict[str, int], convention: str) -> list[str]:
    if sorted(places.values()) != list(range(len(places))):
        raise ConfigError(
            f"{model}: the {kind}s take positions {sorted(places.values())} under the "
            f"{convention} convention; each of 0 to {len(places) - 1} must be taken once"
        )
    return sorted(places, key=places.__getitem__)
