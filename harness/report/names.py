"""How tables, plots and the regression check name and order a record's method.

A record names its method twice: `method` (the implementation, `forge`) and `method_label` (the
conf/method file, `forge_int8_graph`). Tables show the label, marked when the point computed its
loss in chunks; a record made before labels existed shows its method's `title` (declared on its
`Method` class) with its options. Rows list methods in the order each `Method` declares (`order`:
the baseline first, the floor and FORGE last), so that tables and plots come out in the same order
however the results files were written.

    display_name(record)   'forge_int8_graph', 'forge_bf16 (chunked loss)', 'FORGE (state_dtype=int8)'
    ran_as(record)         what ran, where the device made it other than the title: 'AdamW (foreach;
                           no CUDA)' for fused_adamw on a CPU; else display_name
    config_title(label)    how the docs' tables name a conf/method configuration: its `title:`
    method_rank(method)    a sort key: the declared order, unknown methods after, by name
    sort_key(config_key)   a total order over `harness.points.config_key` tuples
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from harness.points import CONFIG_FIELDS, LOSS_NAMES, loss_mode, missing, options_dict
from harness.records import on_cpu
from harness.run import methods
from harness.run.config import CONF_DIR


def method_label(method: str, options: Any = None) -> str:
    """Readable method name with its options, e.g. 'FORGE (state_dtype=int8)'."""
    known = methods.registry().get(method)
    name = known.display_title() if known is not None else method
    opts = options_dict(options)
    if not opts:
        return name
    inner = ", ".join(f"{key}={_short(value)}" for key, value in sorted(opts.items()))
    return f"{name} ({inner})"


def display_name(record: Mapping[str, Any]) -> str:
    """How tables and plots name a record's method: its conf label ('forge_int8') when recorded,
    marked when the point computed its loss in chunks (`loss_mode`)."""
    label = record.get("method_label")
    if missing(label) or not label:
        return method_label(str(record.get("method")), record.get("method_options"))
    loss = loss_mode(record)
    return f"{label} ({LOSS_NAMES[loss]})" if loss else str(label)


def ran_as(record: Mapping[str, Any]) -> str:
    """What the record's point ran, named for a reader: its method's `Method.ran_as` on the device
    it ran on (fused_adamw on a CPU: 'AdamW (foreach; no CUDA)'), else `display_name`."""
    known = methods.registry().get(str(record.get("method")))
    device = "cpu" if on_cpu(record) else "cuda"
    ran = known.ran_as(options_dict(record.get("method_options")), device) if known is not None else None
    return ran or display_name(record)


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def method_rank(method: str) -> tuple[int, str]:
    """Sort key that puts methods in their declared order (`Method.order`), unknown ones after, by name."""
    known = list(methods.registry())
    if method in known:
        return (known.index(method), "")
    return (len(known), str(method))


def sort_key(key: tuple) -> tuple:
    """Total order over config keys (None sorts first, methods in their declared order)."""
    out = []
    for field, value in zip(CONFIG_FIELDS, key):
        if field == "method":
            out.append(method_rank(value))
        else:
            out.append((value is not None, str(value) if isinstance(value, str) else value or 0))
    return tuple(out)


@functools.cache
def config_title(label: str) -> str:
    """How the docs' tables name the configuration `label` (conf/method/<label>.yaml): its file's
    `title:` ("FORGE, bf16 states"), else the label itself."""
    path = CONF_DIR / "method" / f"{label}.yaml"
    if not path.is_file():
        raise ValueError(f"no conf/method/{label}.yaml: name a method configuration the tables can title")
    title = OmegaConf.load(path).get("title")
    return str(title) if title else label
