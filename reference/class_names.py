"""One table of connector class names: UCM's, the TLA+ model's, the reference's and the config's.

Conformance (which reference class replays a model's inner class), `deferdump mro` (the model's name of the
wrapper) and the docs (spec/README.md, "Class names") read the names from here, so a rename happens once.
UCM's chain is `UCMDirectConnector` <- `UCMLayerWiseConnector` <- `UCMCPConnector`, with the wrapper
`UCMConnector` holding one of them; the reference mirrors it class for class.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectorNames:
    """The names of one connector class across UCM, the model, the reference and the config."""

    variant: str  # the config's `variant` value ("" for the wrapper)
    ucm: str  # UCM's class name, also the class name in spec/RealTable.tla
    model: str  # the RealTable.tla operator naming it, and the manifest's `variant`
    reference: str  # the class in deferdump.reference.connectors
    mro: tuple[str, ...]  # the reference classes whose code this variant runs, base first


INNER: tuple[ConnectorNames, ...] = (
    ConnectorNames("direct", "UCMDirectConnector", "Direct", "DirectConnector", ("DirectConnector",)),
    ConnectorNames("layerwise", "UCMLayerWiseConnector", "LayerWise", "LayerWiseConnector",
                   ("DirectConnector", "LayerWiseConnector")),
    ConnectorNames("cp", "UCMCPConnector", "CP", "CPConnector", ("DirectConnector", "LayerWiseConnector", "CPConnector")),
)
OUTER = ConnectorNames("", "UCMConnector", "Outer", "OuterConnector", ("OuterConnector",))

BY_UCM: dict[str, ConnectorNames] = {names.ucm: names for names in INNER}
BY_MODEL: dict[str, ConnectorNames] = {names.model: names for names in INNER}
BY_VARIANT: dict[str, ConnectorNames] = {names.variant: names for names in INNER}
