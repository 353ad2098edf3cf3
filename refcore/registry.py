"""Load and validate `specs/*.yaml` into the frozen data model of `refcore.spec`.

Every error names the file and the entry. The default registry is loaded once, on first use, never
at ``import refcore``.

Example:
    >>> from refcore.registry import default_registry
    >>> default_registry().op("relu").signature.name
    'relu'
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from refcore import schema
from refcore.spec import (
    DTYPES,
    GRAPH_OPS,
    LAYOUTS,
    ActivationQuant,
    BackwardSpec,
    BenchSpec,
    ErrorCase,
    FusionSpec,
    LayoutSpec,
    OpSpec,
    OptimizerSpec,
    Pat,
    QuantSchemeSpec,
    SampleCase,
    Tolerance,
    TorchSpec,
)

KINDS = ("ops", "fusions", "quant_schemes", "layouts", "optimizers", "tags", "benchmarks")
EXCEPTIONS = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError}

_OP_KEYS = {
    "signature", "doc", "torch", "dtypes", "tags", "choices", "tolerance", "oracle_tolerance",
    "samples", "errors", "reference", "check", "packed_args", "out_dtype", "backward",
}  # fmt: skip
_SAMPLE_KEYS = {"dims", "args", "layouts", "tier", "dtypes", "note", "no_oracle"}
_ERROR_KEYS = {"why", "args", "raises", "match", "dtype"}


class SpecError(ValueError):
    """A spec file that is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Registry:
    ops: Mapping[str, OpSpec]
    fusions: Mapping[str, FusionSpec]
    quant_schemes: Mapping[str, QuantSchemeSpec]
    layouts: Mapping[str, LayoutSpec]
    optimizers: Mapping[str, OptimizerSpec]
    tags: Mapping[str, str]
    benchmarks: Mapping[str, tuple[BenchSpec, ...]]

    def op(self, name: str) -> OpSpec:
        """The spec of op ``name``; `ValueError` listing the known ops when there is none."""
        try:
            return self.ops[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown op {name!r}; known ops: {', '.join(sorted(self.ops))}"
            ) from None


def resolve(dotted: str) -> Callable[..., Any]:
    """Import ``'package.module:attr'`` (or ``'package.module.attr'``) and return the attribute."""
    mod, sep, attr = dotted.partition(":")
    if not sep:  # the longest importable prefix is the module: torch.Tensor.add -> torch
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod, attr = ".".join(parts[:i]), ".".join(parts[i:])
            try:
                importlib.import_module(mod)
                break
            except ImportError:
                continue
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def spec_dir() -> Path:
    """The directory holding the shipped spec files."""
    return Path(str(resources.files("refcore.specs")))


@functools.cache
def default_registry() -> Registry:
    """The registry of the shipped specs, loaded and validated once per process."""
    return load(sorted(spec_dir().glob("*.yaml")))


#: set while `load` runs: derived functions (`refcore.derive`) are resolved unchecked then
LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar("refcore_registry_loading",
                                                              default=False)  # fmt: skip


def load(paths: Iterable[Path | str], *, resolve_callables: bool = True) -> Registry:
    """Load spec files into a `Registry`, raising `SpecError` on the first problem found."""
    token = LOADING.set(True)
    try:
        return _load(paths, resolve_callables)
    finally:
        LOADING.reset(token)


def _load(paths: Iterable[Path | str], resolve_callables: bool) -> Registry:
    found: dict[str, dict[str, Any]] = {k: {} for k in KINDS}
    raw_ops: list[tuple[str, str, str, dict, dict]] = []
    for path in map(Path, paths):
        data = _read(path)
        kind = data["kind"]
        for name, entry in data.get(kind, {}).items():
            where = f"{path.name}: {kind[:-1]} {name!r}"
            if name in found[kind]:
                raise SpecError(f"{where}: defined twice")
            if kind == "ops":
                raw_ops.append((path.name, data.get("family", path.stem), name, entry, data))
                found["ops"][name] = None
            elif kind == "tags":
                found["tags"][name] = str(entry)
            elif kind == "benchmarks":
                found[kind][name] = _benchmarks(path.name, name, entry, where)
            else:
                found[kind][name] = _BUILDERS[kind](path.name, name, entry, where)
    tags = found["tags"]
    for file, family, name, entry, data in raw_ops:
        where = f"{file}: op {name!r}"
        found["ops"][name] = _op(file, family, name, entry, data.get("defaults", {}), tags, where)
    found["benchmarks"] = {
        op: tuple(_default_case(b, found["ops"].get(op)) for b in shapes)
        for op, shapes in found["benchmarks"].items()
    }
    reg = Registry(**found)
    _cross_check(reg)
    if resolve_callables:
        _resolve_all(reg)
    return reg


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        # Merge keys (`<<: *anchor`) may be overridden by explicit keys; only explicit ones count.
        keys = [
            self.construct_object(k, deep=deep)
            for k, _ in node.value
            if k.tag != "tag:yaml.org,2002:merge"
        ]
        dupes = sorted({str(k) for k in keys if keys.count(k) > 1})
        if dupes:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate keys {dupes}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(), Loader=_StrictLoader)
    except (OSError, yaml.YAMLError) as e:
        raise SpecError(f"{path.name}: cannot be read as YAML: {e}") from e
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        raise SpecError(f"{path.name}: top-level 'kind' must be one of {', '.join(KINDS)}")
    kind = data["kind"]
    if not isinstance(data.get(kind, {}), dict):
        raise SpecError(f"{path.name}: '{kind}' must be a mapping of name -> entry")
    unknown = set(data) - {"kind", "family", "doc", "defaults", kind}
    if unknown:
        raise SpecError(f"{path.name}: unknown top-level keys {sorted(unknown)}")
    return data


def _need(entry: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in entry:
        raise SpecError(f"{where}: missing required key {key!r}")
    return entry[key]


def _unknown(entry: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = set(entry) - allowed
    if extra:
        raise SpecError(f"{where}: unknown keys {sorted(extra)}; allowed: {sorted(allowed)}")


def _tolerances(raw: Any, dtypes: Iterable[str], where: str, required: bool) -> dict:
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: tolerance must map dtype -> {{atol, rtol}}")
    out = {}
    for dt, tol in raw.items():
        if dt not in DTYPES or not isinstance(tol, dict) or set(tol) != {"atol", "rtol"}:
            raise SpecError(f"{where}: tolerance for {dt!r} must be {{atol: x, rtol: y}}")
        out[dt] = Tolerance(float(tol["atol"]), float(tol["rtol"]))
    missing = [d for d in dtypes if d not in out]
    if required and missing:
        raise SpecError(f"{where}: no tolerance for dtypes {missing}")
    return out


def _op(file, family, name, entry, defaults, tags, where) -> OpSpec:
    if not isinstance(entry, dict):
        raise SpecError(f"{where}: entry must be a mapping")
    _unknown(entry, _OP_KEYS, where)
    merged = {**defaults, **entry}
    try:
        sig = schema.parse(_need(merged, "signature", where))
    except schema.SchemaError as e:
        raise SpecError(f"{where}: {e}") from None
    if sig.name != name:
        raise SpecError(f"{where}: signature names op {sig.name!r}")
    sig = _with_choices(sig, merged.get("choices", {}), where)
    dtypes = tuple(_need(merged, "dtypes", where))
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise SpecError(f"{where}: dtypes {bad or dtypes} not among {DTYPES}")
    op_tags = tuple(merged.get("tags", ()))
    unknown_tags = [t for t in op_tags if t not in tags]
    if unknown_tags:
        raise SpecError(f"{where}: unknown tags {unknown_tags}; see specs/tags.yaml")
    t = _need(merged, "torch", where)
    if not isinstance(t, dict) or "function" not in t:
        raise SpecError(f"{where}: torch must be {{function: ..., aten: [...]}}")
    _unknown(t, {"function", "aten", "note", "also", "positional", "extra"}, where + " torch")
    samples = tuple(
        _sample(s, sig, i, where) for i, s in enumerate(_need(merged, "samples", where))
    )
    if not samples:
        raise SpecError(f"{where}: needs at least one sample case")
    errors = tuple(_error(e, sig, i, where) for i, e in enumerate(merged.get("errors", [])))
    packed = {k: tuple(v) for k, v in merged.get("packed_args", {}).items()}
    for form, names in packed.items():
        missing = [n for n in names if n not in {a.name for a in sig.args}]
        if form != "sparse_csr" or missing:
            raise SpecError(f"{where}: packed_args {form!r} -> {names} is not a known form")
    out_dtype = merged.get("out_dtype", "T")
    if out_dtype != "T" and not any(a.name == out_dtype and a.type == "str" for a in sig.args):
        raise SpecError(f"{where}: out_dtype must be T or the name of a str argument")
    module = f"refcore.ops.{family}"
    backward = None
    if "backward" in merged:
        raw = merged["backward"]
        _unknown(raw, {"wrt", "reference", "ops"}, where + " backward")
        wrt = tuple(_need(raw, "wrt", where + " backward"))
        tensor_args = {a.name for a in sig.tensor_args}
        if not wrt or any(w not in tensor_args for w in wrt):
            raise SpecError(f"{where}: backward wrt {list(wrt)} must name tensor arguments")
        ops = raw.get("ops", {})
        if not isinstance(ops, dict) or any(k not in wrt for k in ops):
            raise SpecError(f"{where}: backward ops {ops!r} must map wrt arguments to op names")
        backward = BackwardSpec(wrt, raw.get("reference", f"refcore.ops.grad.{family}:{name}"),
                                tuple(ops.items()))  # fmt: skip
    return OpSpec(
        name=name,
        family=family,
        file=file,
        signature=sig,
        dtypes=dtypes,
        tags=op_tags,
        reference=merged.get("reference", f"{module}:{name}"),
        check=merged.get("check", f"{module}:check_{name}"),
        torch=TorchSpec(
            t["function"],
            tuple(t.get("aten", ())),
            t.get("note", ""),
            tuple(t.get("also", ())),
            tuple(t.get("positional", ())),
            tuple(t.get("extra", {}).items()),
        ),
        tolerance=_tolerances(_need(merged, "tolerance", where), dtypes, where, True),
        oracle_tolerance=_tolerances(merged.get("oracle_tolerance", {}), (), where, False),
        samples=samples,
        errors=errors,
        packed_args=packed,
        doc=str(merged.get("doc", "")).strip(),
        out_dtype=out_dtype,
        backward=backward,
    )


def _with_choices(sig, choices: Mapping[str, Any], where: str):
    import dataclasses

    names = {a.name for a in sig.args}
    for arg in choices:
        if arg not in names:
            raise SpecError(f"{where}: choices for unknown argument {arg!r}")
    args = tuple(
        dataclasses.replace(a, choices=tuple(choices[a.name])) if a.name in choices else a
        for a in sig.args
    )
    return dataclasses.replace(sig, args=args)


def _sample(raw: Any, sig, i: int, where: str) -> SampleCase:
    where = f"{where} sample {i}"
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: must be a mapping")
    _unknown(raw, _SAMPLE_KEYS, where)
    args = _need(raw, "args", where)
    names = {a.name for a in sig.args}
    extra = set(args) - names
    if extra:
        raise SpecError(f"{where}: args {sorted(extra)} are not in the signature")
    required = [a.name for a in sig.args if not a.has_default and a.name not in args]
    if required:
        raise SpecError(f"{where}: no generator for required args {required}")
    layouts = tuple(raw.get("layouts", ("contiguous",)))
    if any(lay not in LAYOUTS for lay in layouts):
        raise SpecError(f"{where}: layouts {layouts} not among {LAYOUTS}")
    tier = raw.get("tier", "small")
    if tier not in ("small", "large"):
        raise SpecError(f"{where}: tier must be small or large, got {tier!r}")
    dims = raw.get("dims", {})
    if not isinstance(dims, dict):
        raise SpecError(f"{where}: dims must map a symbol to an int, [lo, hi] or an expression")
    dtypes = tuple(raw["dtypes"]) if "dtypes" in raw else None
    no_oracle = tuple(raw.get("no_oracle", ()))
    if no_oracle and not raw.get("note"):
        raise SpecError(f"{where}: no_oracle {list(no_oracle)} needs a note saying why")
    return SampleCase(
        tuple(dims.items()), tuple(args.items()), layouts, tier, dtypes, raw.get("note", ""),
        no_oracle,
    )  # fmt: skip


def _error(raw: Any, sig, i: int, where: str) -> ErrorCase:
    where = f"{where} error {i}"
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: must be a mapping")
    _unknown(raw, _ERROR_KEYS, where)
    raises = _need(raw, "raises", where)
    if raises not in EXCEPTIONS:
        raise SpecError(f"{where}: raises must be one of {sorted(EXCEPTIONS)}")
    extra = set(_need(raw, "args", where)) - {a.name for a in sig.args}
    if extra:
        raise SpecError(f"{where}: args {sorted(extra)} are not in the signature")
    return ErrorCase(
        why=_need(raw, "why", where),
        args=tuple(raw["args"].items()),
        raises=raises,
        match=_need(raw, "match", where),
        dtype=raw.get("dtype", "float32"),
    )


_FUSION_KEYS = {"pattern", "op", "args", "where", "outputs", "rewrite", "stage", "round", "doc"}
_PAT_KEYS = {"op", "as", "optional", "absent", "open", "ordered"}
STAGES = ("fold_bn", "int8", "fold_affine", "attention", "fuse")


def _fusion(file, name, entry, where) -> FusionSpec:
    if not isinstance(entry, dict):
        raise SpecError(f"{where}: entry must be a mapping")
    _unknown(entry, _FUSION_KEYS, where)
    pattern = _pattern(_need(entry, "pattern", where), where)
    if not isinstance(pattern, Pat) or not pattern.ops or pattern.optional:
        raise SpecError(f"{where}: pattern must be a (non-optional) op node")
    stage, rounding = entry.get("stage", "fuse"), entry.get("round", "each")
    if stage not in STAGES or rounding not in ("each", "once"):
        raise SpecError(f"{where}: stage must be one of {STAGES}, round 'each' or 'once'")
    # an entry may itself be a list: conditions shared between fusions through a YAML anchor
    raw = entry.get("where", [])
    conds = [c for e in raw for c in (e if isinstance(e, list) else [e])] \
        if isinstance(raw, list) else None  # fmt: skip
    if conds is None or not all(isinstance(c, str) for c in conds):
        raise SpecError(f"{where}: where must be a list of condition strings (or of such lists)")
    return FusionSpec(
        name, file, pattern, entry.get("op"), tuple(dict(entry.get("args", {})).items()),
        tuple(conds), tuple(entry.get("outputs", ())), entry.get("rewrite"), stage, rounding,
        str(entry.get("doc", "")).strip(),
    )  # fmt: skip


def _pattern(raw: Any, where: str) -> Any:
    """A `Pat` from its YAML form: ``$name`` captures, ``{op: ..., <arg>: ...}`` nodes, lists
    of patterns, and constants (anything else)."""
    if isinstance(raw, str) and raw.startswith("$"):
        return Pat(name=raw[1:])
    if isinstance(raw, list):
        return tuple(_pattern(x, where) for x in raw)
    if not isinstance(raw, dict):
        return raw
    if "op" not in raw:
        raise SpecError(f"{where}: pattern node {raw} names no op")
    ops = (raw["op"],) if isinstance(raw["op"], str) else tuple(raw["op"])
    args = tuple((k, _pattern(v, where)) for k, v in raw.items() if k not in _PAT_KEYS)
    optional = bool(raw.get("optional", False))
    if optional and "input" not in dict(args):
        raise SpecError(f"{where}: optional node {ops} needs an input pattern to stand for it")
    absent = tuple(dict(raw.get("absent", {})).items())
    flags = bool(raw.get("open", False)), bool(raw.get("ordered", False))
    return Pat(ops, args, raw.get("as"), optional, absent, *flags)


def _activation(entry, where) -> ActivationQuant | None:
    if entry is None:
        return None
    where = f"{where} activation"
    _unknown(entry, {"dtype", "symmetric", "quant_min", "quant_max", "observer", "op", "eps"},
             where)  # fmt: skip
    dtype = _need(entry, "dtype", where)
    lo, hi = _need(entry, "quant_min", where), _need(entry, "quant_max", where)
    full = {"uint8": (0, 255), "int8": (-128, 127)}.get(dtype)
    if full is None or not full[0] <= lo <= hi <= full[1]:
        raise SpecError(f"{where}: dtype uint8 or int8 with quant_min <= quant_max in its range")
    eps = entry.get("eps", ActivationQuant.eps)
    if not isinstance(eps, float) or not eps > 0:
        raise SpecError(f"{where}: eps must be a positive float")
    return ActivationQuant(dtype, bool(_need(entry, "symmetric", where)), lo, hi,
                           _need(entry, "observer", where), _need(entry, "op", where),
                           eps)  # fmt: skip


def _quant(file, name, entry, where) -> QuantSchemeSpec:
    keys = {"dtype", "granularity", "symmetric", "axis", "group_size", "doc", "op", "rule",
            "activation", "conv_op"}  # fmt: skip
    _unknown(entry, keys, where)
    gran = _need(entry, "granularity", where)
    if gran not in ("per_tensor", "per_channel", "per_group"):
        raise SpecError(f"{where}: granularity must be per_tensor, per_channel or per_group")
    dtype = _need(entry, "dtype", where)
    if dtype not in ("int8", "uint8", "int4"):
        raise SpecError(f"{where}: dtype must be int8, uint8 or int4, got {dtype!r}")
    return QuantSchemeSpec(
        name, file, dtype, gran, bool(_need(entry, "symmetric", where)),
        entry.get("axis"), entry.get("group_size"), entry.get("doc", ""), entry.get("op", ""),
        entry.get("rule", ""), _activation(entry.get("activation"), where),
        entry.get("conv_op", ""),
    )  # fmt: skip


def _layout(file, name, entry, where) -> LayoutSpec:
    _unknown(entry, {"dtypes", "block", "pack", "unpack", "args", "params", "doc"}, where)
    params = entry.get("params", {})
    if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
        raise SpecError(f"{where}: params must map parameter names to argument names")
    return LayoutSpec(
        name, file, tuple(_need(entry, "dtypes", where)), tuple(_need(entry, "block", where)),
        _need(entry, "pack", where), _need(entry, "unpack", where), entry.get("doc", ""),
        tuple(entry.get("args", ())), tuple(params.items()),
    )  # fmt: skip


MASTERS = ("float32", "split_bf16")


def _optimizer(file, name, entry, where) -> OptimizerSpec:
    _unknown(entry, {"hyperparameters", "state", "reference", "torch", "masters", "doc"}, where)
    hps = dict(_need(entry, "hyperparameters", where))
    for hp, raw in hps.items():
        w = f"{where} hyperparameter {hp!r}"
        if not isinstance(raw, dict) or "default" not in raw:
            raise SpecError(f"{w}: must be a mapping with a 'default'")
        _unknown(raw, {"default", "range", "choice"}, w)
        if ("range" in raw) == ("choice" in raw):
            raise SpecError(f"{w}: give exactly one of 'range' [lo, hi] or 'choice'")
        if "range" in raw and not (len(raw["range"]) == 2 and raw["range"][0] <= raw["range"][1]):
            raise SpecError(f"{w}: range must be [lo, hi] with lo <= hi")
    masters = tuple(entry.get("masters", ("float32",)))
    if any(m not in MASTERS for m in masters):
        raise SpecError(f"{where}: masters {masters} not among {MASTERS}")
    return OptimizerSpec(
        name, file, hps, tuple(_need(entry, "state", where)), _need(entry, "reference", where),
        entry.get("doc", ""), entry.get("torch", ""), masters,
    )  # fmt: skip


_BUILDERS = {
    "fusions": _fusion,
    "quant_schemes": _quant,
    "layouts": _layout,
    "optimizers": _optimizer,
}


def _benchmarks(file, op, entries, where) -> tuple[BenchSpec, ...]:
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{where}: must be a non-empty list of benchmark shapes")
    out = []
    for i, e in enumerate(entries):
        w = f"{where} shape {i}"
        if not isinstance(e, dict):
            raise SpecError(f"{w}: must be a mapping")
        _unknown(e, {"label", "case", "dims", "args", "flops", "bytes", "layout", "torch"}, w)
        if e.get("layout", "contiguous") not in ("contiguous", "channels_last"):
            raise SpecError(f"{w}: layout must be contiguous or channels_last")
        dims = _need(e, "dims", w)
        if not isinstance(dims, dict) or not all(isinstance(v, int) for v in dims.values()):
            raise SpecError(f"{w}: dims must map each symbol to a fixed int")
        out.append(BenchSpec(
            op=op, file=file, label=str(_need(e, "label", w)), case=int(e.get("case", -1)),
            dims=tuple(dims.items()), args=tuple(e.get("args", {}).items()), flops=e.get("flops"),
            bytes=e.get("bytes"), layout=e.get("layout", "contiguous"), torch=e.get("torch"),
        ))  # fmt: skip
    return tuple(out)


def _default_case(b: BenchSpec, op: OpSpec | None) -> BenchSpec:
    """A benchmark without ``case`` uses the op's first ``tier: large`` sample case."""
    import dataclasses

    if b.case >= 0 or op is None:
        return b
    large = [i for i, c in enumerate(op.samples) if c.tier == "large"]
    return dataclasses.replace(b, case=large[0] if large else 0)


def _cross_check(reg: Registry) -> None:
    for name, opt in reg.optimizers.items():  # kernels are found by name: one namespace
        if name in reg.ops:
            raise SpecError(f"{opt.file}: optimizer {name!r} has the name of an op")
    for op, shapes in reg.benchmarks.items():
        if op not in reg.ops:
            raise SpecError(f"{shapes[0].file}: benchmark for unknown op {op!r}")
        for b in shapes:
            samples = reg.ops[op].samples
            if not 0 <= b.case < len(samples):
                raise SpecError(f"{b.file}: benchmark {op} {b.label!r}: no sample case {b.case}")
            known = {d for d, _ in samples[b.case].dims}
            names = {a for a, _ in samples[b.case].args}
            if set(dict(b.dims)) - known or set(dict(b.args)) - names:
                raise SpecError(
                    f"{b.file}: benchmark {op} {b.label!r}: dims {sorted(dict(b.dims))} / args "
                    f"{sorted(dict(b.args))} not in sample case {b.case} (dims {sorted(known)})"
                )
    for lay in reg.layouts.values():
        for oa in lay.args:
            op, _, arg = oa.partition(".")
            if op not in reg.ops or arg not in {a.name for a in reg.ops[op].signature.tensor_args}:
                raise SpecError(
                    f"{lay.file}: layout {lay.name!r}: {oa!r} is not an op's tensor argument"
                )
            for param, source in lay.params:
                if source.removesuffix(".shape") not in reg.ops[op].signature.names:
                    raise SpecError(
                        f"{lay.file}: layout {lay.name!r}: param {param!r} reads {source!r}, "
                        f"which is not an argument of {op}"
                    )
    for f in reg.fusions.values():
        _check_fusion(reg, f)
    for spec in reg.ops.values():
        for arg, op in spec.backward.ops if spec.backward else ():
            _check_backward_op(reg, spec, arg, op)


def _check_backward_op(reg: Registry, spec: OpSpec, arg: str, op: str) -> None:
    """A gradient op takes ``grad_output`` and then exactly the forward op's arguments, in the
    forward's dtypes, so the gradient of a routed call is a call of it."""
    where = f"{spec.file}: {spec.name} backward ops {arg}: {op!r}"
    if op not in reg.ops:
        raise SpecError(f"{where} is not an op")
    want = ("grad_output", *(a.name for a in spec.signature.args))
    got = tuple(a.name for a in reg.ops[op].signature.args)
    if got != want:
        raise SpecError(f"{where} takes {list(got)}; expected {list(want)}")
    if reg.ops[op].dtypes != spec.dtypes:
        raise SpecError(f"{where} has dtypes {list(reg.ops[op].dtypes)}; expected "
                        f"{list(spec.dtypes)}")  # fmt: skip


def _pattern_args(reg: Registry, op: str) -> set[str] | None:
    """The argument names a pattern node of ``op`` may use (None: unknown op)."""
    if op in reg.ops:
        return set(reg.ops[op].signature.names)
    if op in GRAPH_OPS:
        return {*GRAPH_OPS[op][2], *GRAPH_OPS[op][3]}
    return None


def _captures(p: Any) -> set[str]:
    if isinstance(p, tuple):
        return set().union(*(_captures(x) for x in p)) if p else set()
    if not isinstance(p, Pat):
        return set()
    own = {p.name} if p.name else set()
    return own.union({k for k, _ in p.absent}, *(_captures(v) for _, v in p.args))


def _check_fusion(reg: Registry, f: FusionSpec) -> None:
    where = f"{f.file}: fusion {f.name!r}"

    def walk(p: Any) -> None:
        if isinstance(p, tuple):
            for x in p:
                walk(x)
        if not isinstance(p, Pat):
            return
        for op in p.ops:
            names = _pattern_args(reg, op)
            if names is None:
                raise SpecError(f"{where}: pattern names unknown op {op!r}")
            bad = {k for k, _ in p.args} - names
            if bad:
                raise SpecError(f"{where}: {op} has no arguments {sorted(bad)}")
        for _, v in p.args:
            walk(v)

    walk(f.pattern)
    if f.op is None:
        return
    if f.op not in reg.ops:
        raise SpecError(f"{where}: op {f.op!r} is not declared")
    sig = reg.ops[f.op].signature
    given = _captures(f.pattern) | {k for k, _ in f.args}
    missing = [a.name for a in sig.args if not a.has_default and a.name not in given]
    if missing:
        raise SpecError(f"{where}: the pattern captures nothing for {f.op}'s {missing}")
    unknown = {k for k, _ in f.args} - sig.names
    if unknown:
        raise SpecError(f"{where}: args {sorted(unknown)} are not {f.op}'s")
    for n in f.outputs:
        if n not in _captures(f.pattern):
            raise SpecError(f"{where}: output {n!r} is not a capture of the pattern")
    if "fused" in reg.ops[f.op].tags and f.args:
        raise SpecError(
            f"{where}: a fused op's arguments must be captures (its meaning is derived)"
        )


def _resolve_all(reg: Registry) -> None:
    def check(file, what, dotted, kind=None):
        try:
            fn = resolve(dotted)
        except (ImportError, AttributeError, ValueError) as e:
            raise SpecError(f"{file}: {what}: cannot import {dotted!r}: {e}") from None
        if kind is not None and not isinstance(fn, kind):
            raise SpecError(f"{file}: {what}: {dotted!r} is not a {kind.__name__}")
        if kind is None and not callable(fn):
            raise SpecError(f"{file}: {what}: {dotted!r} is not callable")

    for op in reg.ops.values():
        where = f"op {op.name!r}"
        check(op.file, f"{where} reference", op.reference)
        check(op.file, f"{where} check", op.check)
        if op.backward:
            check(op.file, f"{where} backward", op.backward.reference)
    for lay in reg.layouts.values():
        check(lay.file, f"layout {lay.name!r} pack", lay.pack)
        check(lay.file, f"layout {lay.name!r} unpack", lay.unpack)
    for opt in reg.optimizers.values():
        check(opt.file, f"optimizer {opt.name!r} reference", opt.reference)
    for shapes in reg.benchmarks.values():
        for b in shapes:
            if b.torch:
                check(b.file, f"benchmark {b.op} {b.label!r} torch", b.torch)
    for q in reg.quant_schemes.values():
        where = f"quant scheme {q.name!r}"
        if q.rule:
            check(q.file, f"{where} rule", q.rule)
        ops = [q.op, q.conv_op, q.activation.op if q.activation else ""]
        for name in filter(None, ops):
            if name not in reg.ops:
                raise SpecError(f"{q.file}: {where}: op {name!r} is not a spec'd op")
        if q.activation:
            from refcore.ops.observers import Observer

            check(q.file, f"{where} observer", q.activation.observer, Observer)
    for f in reg.fusions.values():
        if f.rewrite:  # a graph pass (torch.fx): found here, imported only by the pass itself
            mod = f.rewrite.partition(":")[0]
            if importlib.util.find_spec(mod) is None:
                raise SpecError(f"{f.file}: fusion {f.name!r} rewrite: no module {mod!r}")
