"""Frozen dataclasses for everything `specs/*.yaml` declares.

This module is the data model only: no I/O, no imports of torch. `refcore.registry` builds these
objects from YAML and validates them; every other layer reads them.

A spec file has a ``kind`` and holds entries of that kind:

- ``ops``: op entries (`OpSpec`): signature, torch counterparts, dtypes, tolerances, samples.
- ``fusions``: fusion patterns (`FusionSpec`): a DAG pattern (`Pat`) and the op a match becomes.
- ``quant_schemes``: quantization schemes (`QuantSchemeSpec`; specs/schemes.yaml).
- ``layouts``: prepacked / blocked weight layouts (`LayoutSpec`) with pack/unpack references.
- ``optimizers``: optimizer-update semantics (`OptimizerSpec`), e.g. split-BF16 SGD/AdamW.
- ``benchmarks``: benchmark shapes per op (`BenchSpec`), read by ``refcore bench`` and asv.

Example:
    >>> from refcore.spec import Arg
    >>> Arg(name="eps", type="float", default=1e-5).is_tensor
    False
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: dtype names used across specs, references and providers.
FLOAT_DTYPES = ("float32", "bfloat16")
INT_DTYPES = ("int8", "uint8", "int32", "int64")
DTYPES = (*FLOAT_DTYPES, "float16", "float64", *INT_DTYPES, "bool")

#: attribute types a schema may use (tensors are ``Tensor`` / ``Tensor(dtypes)``).
ATTR_TYPES = ("int", "float", "bool", "str", "int[]", "int[2]", "int[2]|str")

#: memory layouts a sample or a kernel can name (``unaligned``: contiguous memory one byte past
#: an aligned address, as ``torch.frombuffer(..., offset=1)`` gives; only ``strided`` kernels
#: accept it, see `refcore.call.Call.layout`).
LAYOUTS = ("contiguous", "strided", "transposed", "channels_last", "unaligned")

_NO_DEFAULT = object()


@dataclass(frozen=True)
class Arg:
    """One argument of an op signature.

    ``type`` is ``"Tensor"`` or one of `ATTR_TYPES`. ``dtypes`` (tensors only) lists allowed
    dtype names; ``"T"`` stands for the op's compute dtype, shared by every ``T`` tensor.
    """

    name: str
    type: str
    optional: bool = False
    default: Any = _NO_DEFAULT
    kwarg_only: bool = False
    dtypes: tuple[str, ...] = ("T",)
    choices: tuple[Any, ...] | None = None

    @property
    def is_tensor(self) -> bool:
        return self.type == "Tensor"

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT


@dataclass(frozen=True)
class Signature:
    name: str
    args: tuple[Arg, ...]
    returns: str = "Tensor"

    def arg(self, name: str) -> Arg:
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)

    @functools.cached_property
    def tensor_args(self) -> tuple[Arg, ...]:
        # cached: every call's bind and every kernel's layout check walk it
        return tuple(a for a in self.args if a.is_tensor)

    @functools.cached_property
    def positional(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.kwarg_only)

    @functools.cached_property
    def names(self) -> frozenset[str]:
        return frozenset(a.name for a in self.args)

    def __str__(self) -> str:
        parts, star = [], False
        for a in self.args:
            if a.kwarg_only and not star:
                parts.append("*")
                star = True
            t = a.type
            if a.is_tensor and a.dtypes != ("T",):
                t += "(" + "|".join(a.dtypes) + ")"
            if a.optional:
                t += "?"
            parts.append(f"{t} {a.name}" + (f"={a.default!r}" if a.has_default else ""))
        return f"{self.name}({', '.join(parts)}) -> {self.returns}"


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class SampleCase:
    """One way to draw valid inputs.

    ``dims`` maps a dimension symbol to an int, an inclusive ``[lo, hi]`` range, or an expression
    over earlier symbols. ``args`` maps each argument to a generator description (see
    ``refcore/sampling.py`` for the closed vocabulary). ``layouts`` lists the memory layouts the
    tensor arguments may be drawn in. ``tier`` is ``small`` (property tests) or ``large``
    (the fixed-seed reference set).
    """

    dims: tuple[tuple[str, Any], ...]
    args: tuple[tuple[str, Any], ...]
    layouts: tuple[str, ...] = ("contiguous",)
    tier: str = "small"
    dtypes: tuple[str, ...] | None = None
    note: str = ""
    #: dtypes for which torch is no oracle on this case (the note says why): the reference-vs-torch
    #: suite draws no such inputs; kernels are still tested against the reference on them.
    no_oracle: tuple[str, ...] = ()


@dataclass(frozen=True)
class ErrorCase:
    """Bad input paired with the exception it must raise (message must contain ``match``)."""

    why: str
    args: tuple[tuple[str, Any], ...]
    raises: str
    match: str
    dtype: str = "float32"


@dataclass(frozen=True)
class TorchSpec:
    """What torch calls this op: the oracle callable and the aten overloads it stands for."""

    function: str
    aten: tuple[str, ...] = ()
    note: str = ""
    also: tuple[str, ...] = ()  # other torch callables with the same meaning (methods, operators)
    # How torch's function takes its arguments when that differs from the op's signature (used to
    # route torch calls): its positional order, and torch-only arguments with the value refcore
    # requires ("any" when they do not change the forward result, e.g. _stacklevel).
    positional: tuple[str, ...] = ()
    extra: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class BackwardSpec:
    """An op's gradient: the arguments it is differentiable in and the backward reference
    (``fn(grad_output, **arguments) -> {arg: gradient}``, refcore.ops.grad).

    ``ops`` names, for some of the ``wrt`` arguments, the op whose result is that argument's
    gradient (signature: ``grad_output`` and then the forward op's arguments). Those gradients
    dispatch to kernels like any op, so a routed call that needs autograd may run a kernel
    forward when every argument it needs a gradient of has one (`refcore.integration`)."""

    wrt: tuple[str, ...]
    reference: str
    ops: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OpSpec:
    name: str
    family: str
    file: str
    signature: Signature
    dtypes: tuple[str, ...]
    tags: tuple[str, ...]
    reference: str
    check: str
    torch: TorchSpec
    tolerance: dict[str, Tolerance]
    oracle_tolerance: dict[str, Tolerance]
    samples: tuple[SampleCase, ...]
    errors: tuple[ErrorCase, ...] = ()
    packed_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    doc: str = ""
    #: the output's dtype: ``"T"`` (the compute dtype) or the name of a ``str`` argument whose
    #: value names it (quantize_per_tensor's ``dtype``)
    out_dtype: str = "T"
    backward: BackwardSpec | None = None

    @functools.cached_property
    def allowed_dtypes(self) -> dict[str, tuple[tuple[str, ...], bool, tuple[str, ...]]]:
        """Tensor argument -> (the dtype names it accepts, whether it takes the compute dtype T,
        its declared dtypes); computed once, read by every bind."""
        out = {}
        for a in self.signature.tensor_args:
            flat = tuple(d for g in a.dtypes for d in (self.dtypes if g == "T" else (g,)))
            out[a.name] = (flat, "T" in a.dtypes, a.dtypes)
        return out

    def output_dtype(self, dtype: str, args: Mapping[str, Any]) -> str:
        """The dtype name of the output of a call computing in ``dtype`` with ``args``."""
        return dtype if self.out_dtype == "T" else str(args[self.out_dtype])

    def tolerance_for(self, dtype: str, *, oracle: bool = False) -> Tolerance:
        if oracle and dtype in self.oracle_tolerance:
            return self.oracle_tolerance[dtype]
        return self.tolerance[dtype]


@dataclass(frozen=True)
class BenchSpec:
    """A benchmark shape for an op: one of its sample cases with fixed dims (and arg overrides).

    ``flops`` is an expression over the dims (e.g. ``"2*M*N*K"``) for compute-bound ops;
    memory-bound ops report bytes moved: ``bytes`` (an expression over the dims and ``esize``, the
    element size) where reading every input in full would overstate it (gathers), else inputs +
    output. ``layout`` is the memory layout of the tensors (``contiguous`` or ``channels_last``).
    ``torch`` names the torch callable timed as the anchor when it is not the op's own torch
    function (qlinear: torch's int8 path, where the op's function is its exact float64 oracle).
    """

    op: str
    file: str
    label: str
    case: int
    dims: tuple[tuple[str, int], ...]
    args: tuple[tuple[str, Any], ...] = ()
    flops: str | None = None
    bytes: str | None = None
    layout: str = "contiguous"
    torch: str | None = None


#: Graph ops a fusion pattern may name besides the spec'd ops (specs/fusions.yaml), and extra
#: spellings of spec'd ops as graphs write them: name -> (torch callables, Tensor method names,
#: positional argument names, argument values implied by a method). A ``call_method`` node's
#: first argument is ``input``.
GRAPH_OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], dict]] = {
    "mul": (("operator.mul",), ("mul", "__mul__"), (), {}),
    "relu": (("torch.relu",), ("relu",), (), {}),
    "matmul": (("operator.matmul",), ("matmul", "__matmul__"), (), {}),
    "softmax": (("torch.softmax",), ("softmax",), (), {}),
    "div": (("torch.div", "operator.truediv"), ("div", "__truediv__"), ("input", "other"), {}),
    "transpose": (("torch.transpose",), ("transpose",), ("input", "dim0", "dim1"), {}),
    "pow": (("torch.pow", "operator.pow"), ("pow", "__pow__"), ("input", "exponent"), {}),
    "mean": (("torch.mean",), ("mean",), ("input", "dim", "keepdim"), {"keepdim": False}),
    "rsqrt": (("torch.rsqrt",), ("rsqrt",), ("input",), {}),
    "neg": (("torch.neg", "operator.neg"), ("neg", "__neg__"), ("input",), {}),
    "cat": (("torch.cat",), (), ("tensors", "dim"), {"dim": 0}),
    "getitem": (("operator.getitem",), ("__getitem__",), ("input", "index"), {}),
    "cos": (("torch.cos",), ("cos",), ("input",), {}),
    # the ATen / quantized_decomposed spellings a graph from torch.export (torchao's pt2e int8
    # flow) has; refcore.passes.pt2e resolves them (the decomposed ops register on import)
    "linear": (("refcore.passes.pt2e:aten_linear",), (), (), {}),
    "conv2d": (("refcore.passes.pt2e:aten_conv2d",), (), (), {}),
    "quantize_per_tensor": (("refcore.passes.pt2e:quantize_per_tensor",), (), (), {}),
    "dequantize_per_tensor": (("refcore.passes.pt2e:dequantize_per_tensor",), (), (), {}),
    "dequantize_per_channel": (
        ("refcore.passes.pt2e:dequantize_per_channel",),
        (),
        ("input", "scales", "zero_points", "axis", "quant_min", "quant_max", "dtype"),
        {},
    ),
    "sin": (("torch.sin",), ("sin",), ("input",), {}),
    # PyG's message passing on an edge list (torch_geometric.utils.scatter): gather, broadcast
    # the target index, scatter into fresh zeros (in place: INPLACE below), count, divide
    "index_select": (("torch.index_select",), ("index_select",), ("input", "dim", "index"), {}),
    "expand_as": ((), ("expand_as",), ("input", "other"), {}),
    "new_zeros": ((), ("new_zeros",), ("input", "size"), {}),
    "new_ones": ((), ("new_ones",), ("input", "size"), {}),
    "scatter_add": (("torch.scatter_add",), ("scatter_add",), ("input", "dim", "index", "src"), {}),
    "clamp": (("torch.clamp",), ("clamp",), ("input", "min", "max"), {}),
    # a dtype cast: x.to(dtype), x.float(), x.type(dtype), x.type_as(other) (dtype from other)
    "cast": ((), ("to", "type", "float", "type_as"), ("input", "dtype"), {}),
    # a view (its dims as d0, d1, ...; patterns use it as an optional, open node)
    "view": (
        ("torch.reshape", "torch.unsqueeze", "torch.squeeze", "torch.flatten"),
        ("view", "reshape", "unsqueeze", "squeeze", "flatten", "contiguous"),
        ("input", "d0", "d1", "d2", "d3", "d4", "d5"),
        {},
    ),
}

#: in-place forms (torch callables, method names) a pattern node may take where it mutates a
#: matched intermediate that nothing else uses, so computing out of place is unobservable
INPLACE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "add": (("operator.iadd", "torch.Tensor.add_"), ("add_", "__iadd__")),
    "mul": (("operator.imul", "torch.Tensor.mul_"), ("mul_", "__imul__")),
    "scatter_add": (("torch.Tensor.scatter_add_",), ("scatter_add_",)),
    "scatter_reduce": (("torch.Tensor.scatter_reduce_",), ("scatter_reduce_",)),
}

#: ops a pattern matches in either argument order
COMMUTATIVE = frozenset({"add", "mul"})


@dataclass(frozen=True)
class Pat:
    """One node of a fusion pattern (tinygrad's ``UPat``), parsed from specs/fusions.yaml.

    ``ops`` lists the op names the node may be (spec'd ops or `GRAPH_OPS`); ``()`` is a leaf,
    which matches any argument (a graph node or a constant) and captures it as ``name``.
    ``args`` maps argument names to sub-patterns (`Pat`), constants, or lists of either; an
    argument the pattern does not name must be absent or at its default. A name seen twice in
    one pattern must capture the same value both times (that is how a pattern is a DAG). An
    ``optional`` node (a cast, a view) may be absent: its ``input`` pattern then stands in its
    place and ``absent`` gives the captures it would have bound. An ``open`` node lets arguments
    the pattern does not name take any value; an ``ordered`` add/mul matches only in the order
    written.
    """

    ops: tuple[str, ...] = ()
    args: tuple[tuple[str, Any], ...] = ()
    name: str | None = None
    optional: bool = False
    absent: tuple[tuple[str, Any], ...] = ()
    open: bool = False
    ordered: bool = False

    def nodes(self) -> int:
        """How many graph nodes a full match covers at least (required op nodes)."""
        own = 0 if (self.optional or not self.ops) else 1
        return own + sum(_pat_nodes(v) for _, v in self.args)


def _pat_nodes(v: Any) -> int:
    if isinstance(v, Pat):
        return v.nodes()
    if isinstance(v, tuple):
        return sum(_pat_nodes(x) for x in v)
    return 0


@dataclass(frozen=True)
class FusionSpec:
    """A DAG pattern over torch.fx graphs and what a match becomes.

    ``op`` is the spec'd op a match is replaced by: a fused op (tag ``fused``, whose reference
    and torch oracle are derived from this pattern, `refcore.derive`) or a plain op such as
    ``scaled_dot_product_attention``; None for a pattern that is only matched and reported.
    ``args`` gives an op argument as an expression over the captures where it is not simply the
    capture of the same name; ``where`` lists conditions over the captures (`refcore.patterns`).
    ``outputs`` names captured intermediates that the op's further outputs replace (multi-output
    replacement). ``rewrite`` names a callable doing the replacement itself (BN folding).
    ``stage`` is the pass that applies the pattern (``fold_bn``, ``attention`` or ``fuse``).
    ``round``: ``each`` (the derived meaning rounds every intermediate to the input dtype, as the
    unfused ops do) or ``once`` (computed in fp32, rounded once at the end).
    """

    name: str
    file: str
    pattern: Pat
    op: str | None = None
    args: tuple[tuple[str, Any], ...] = ()
    where: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    rewrite: str | None = None
    stage: str = "fuse"
    round: str = "each"
    doc: str = ""


@dataclass(frozen=True)
class QuantSchemeSpec:
    name: str
    file: str
    dtype: str
    granularity: str  # per_tensor | per_channel | per_group
    symmetric: bool
    axis: int | None = None
    group_size: int | None = None
    doc: str = ""
    op: str = ""  # the spec'd op a layer quantized by this scheme computes
    rule: str = ""  # "module:function": the reference rule making its weights from a float one
    #: how the scheme quantizes a layer's input (None: weight-only)
    activation: ActivationQuant | None = None
    conv_op: str = ""  # the op an ``nn.Conv2d`` computes, where the scheme quantizes convs


@dataclass(frozen=True)
class ActivationQuant:
    """A scheme's activation quantization: per tensor, its (scale, zero_point) from an
    ``observer`` (a `refcore.ops.observers.Observer`, "module:name") over the values seen in
    calibration, applied by op ``op`` (its dtype and quant range as declared)."""

    dtype: str
    symmetric: bool
    quant_min: int
    quant_max: int
    observer: str
    op: str
    eps: float = float(2.0**-23)  # the observer's smallest scale (float32 eps unless declared)


@dataclass(frozen=True)
class LayoutSpec:
    """A prepacked / blocked weight layout with its pack and unpack references."""

    name: str
    file: str
    dtypes: tuple[str, ...]
    block: tuple[int, ...]
    pack: str
    unpack: str
    doc: str = ""
    #: op arguments that may be given in this layout, as ``"op.arg"`` (e.g. ``linear.weight``)
    args: tuple[str, ...] = ()
    #: what the pack reads besides the weight, as (parameter, source) pairs: the source names an
    #: argument of the call (``stride``) or its shape (``input.shape``); see `refcore.packed`
    params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OptimizerSpec:
    """Optimizer-update semantics (e.g. split-BF16 AdamW): state tensors and the reference step."""

    name: str
    file: str
    hyperparameters: dict[str, Any]  # name -> {default, range: [lo, hi] | choice: [...]}
    state: tuple[str, ...]
    reference: str
    doc: str = ""
    torch: str = ""  # the torch optimizer class ("module:Class"), the suite's oracle
    masters: tuple[str, ...] = ("float32",)  # storages of the float32 master weight
