"""Shipped specs are complete and consistent; malformed ones fail loudly, naming file and entry."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # registers the quantized_decomposed ops

from refcore import schema
from refcore.registry import SpecError, default_registry, load, resolve
from refcore.sampling import cases

REG = default_registry()
OPS = sorted(REG.ops)


@pytest.mark.parametrize("op", OPS)
def test_op_has_reference_check_and_samples(op: str) -> None:
    spec = REG.op(op)
    assert callable(resolve(spec.reference)) and callable(resolve(spec.check))
    for dt in spec.dtypes:
        assert cases(spec, dt), f"{op}: no small sample case for {dt}"
    assert spec.doc, f"{op}: no doc"


@pytest.mark.parametrize("op", OPS)
def test_reference_python_signature_mirrors_schema(op: str) -> None:
    """refcore.ops.<family>.<op> takes exactly the schema's arguments, names, order and defaults."""
    spec = REG.op(op)
    for fn in (resolve(spec.reference), resolve(spec.check)):
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == [a.name for a in spec.signature.args], fn.__name__
        for p, a in zip(params, spec.signature.args):
            kw_only = p.kind == inspect.Parameter.KEYWORD_ONLY
            assert kw_only == a.kwarg_only, f"{fn.__name__}: {a.name} keyword-only mismatch"
            if a.has_default:
                assert p.default == a.default, f"{fn.__name__}: default of {a.name}"
            else:
                assert p.default is inspect.Parameter.empty, (
                    f"{fn.__name__}: {a.name} has a default"
                )


#: ops torch itself has no aten op for, so nothing to route: roi_align is torchvision's, whose
#: compiled ops do not load beside this CPU torch (its oracle is ONNX's RoiAlign); gather_scatter
#: is PyG's composition (index_select, mul, scatter_add_), which optimize matches as a pattern,
#: and gather_scatter_backward that composition's autograd (index_add and scatter backwards)
NO_ATEN = {"roi_align", "gather_scatter", "gather_scatter_backward"}


@pytest.mark.parametrize("op", OPS)
def test_torch_counterparts_exist(op: str) -> None:
    spec = REG.op(op)
    assert callable(resolve(spec.torch.function))
    for dotted in spec.torch.also:
        assert callable(resolve(dotted)), dotted
    names = {a.name for a in spec.signature.args}
    assert not {k for k, _ in spec.torch.extra} & names, "extra names a refcore argument"
    assert set(spec.torch.positional) <= names | {k for k, _ in spec.torch.extra}
    assert spec.torch.aten or op in NO_ATEN, f"{op}: declares no aten ops"
    for name in spec.torch.aten:
        ns, opname, overload = name.split(".")
        assert ns in ("aten", "quantized_decomposed", "onednn"), f"{name}: not a core namespace"
        packet = getattr(getattr(torch.ops, ns), opname)
        assert hasattr(packet, overload), f"{name} is not a torch op"


def test_registry_is_loaded_once() -> None:
    assert default_registry() is default_registry()


GOOD = """
kind: ops
family: elementwise
ops:
  relu:
    signature: "relu(Tensor input) -> Tensor"
    doc: d
    torch: {function: torch.relu, aten: [aten.relu.default]}
    dtypes: [float32]
    tolerance: {float32: {atol: 0, rtol: 0}}
    samples: [{args: {input: {tensor: [3]}}}]
"""

def _with_backward(ops: str) -> str:
    return GOOD.replace("    doc: d\n", f"    doc: d\n    backward: {{wrt: [input], ops: {ops}}}\n")


BAD = [
    ("kind: nonsense", "top-level 'kind'"),
    (
        GOOD.replace("    doc: d\n", "    doc: d\n    colour: red\n"),
        "op 'relu': unknown keys ['colour']",
    ),
    (
        GOOD.replace('"relu(Tensor input)', '"relu(Tensr input)'),
        "op 'relu': relu: argument 'input' has type 'Tensr'",
    ),
    (
        GOOD.replace('"relu(Tensor input)', '"gelu(Tensor input)'),
        "op 'relu': signature names op 'gelu'",
    ),
    (GOOD.replace("[float32]", "[float33]"), "op 'relu': dtypes"),
    (
        GOOD.replace("    tolerance: {float32: {atol: 0, rtol: 0}}\n", ""),
        "missing required key 'tolerance'",
    ),
    (
        GOOD.replace("{float32: {atol: 0, rtol: 0}}", "{bfloat16: {atol: 0, rtol: 0}}"),
        "no tolerance for dtypes ['float32']",
    ),
    (
        GOOD.replace("samples: [{args: {input: {tensor: [3]}}}]", "samples: []"),
        "at least one sample",
    ),
    (
        GOOD.replace("{input: {tensor: [3]}}", "{x: {tensor: [3]}}"),
        "args ['x'] are not in the signature",
    ),
    (GOOD.replace("{input: {tensor: [3]}}", "{}"), "no generator for required args ['input']"),
    (GOOD.replace("samples: [{args:", "samples: [{layouts: [diagonal], args:"), "layouts"),
    (GOOD.replace("    doc: d\n", "    doc: d\n    tags: [shiny]\n"), "unknown tags ['shiny']"),
    (
        GOOD.replace("    doc: d\n", "    doc: d\n    reference: refcore.ops.elementwise:nope\n"),
        "op 'relu' reference: cannot import",
    ),
    (
        GOOD.replace(
            "    doc: d\n",
            "    doc: d\n    errors: [{why: w, args: {}, raises: KeyError, match: m}]\n",
        ),
        "raises must be one of",
    ),
    (
        GOOD.replace("samples: [{args:", "samples: [{no_oracle: [float32], args:"),
        "no_oracle ['float32'] needs a note saying why",
    ),
    (
        _with_backward("{out: relu}"),
        "backward ops {'out': 'relu'} must map wrt arguments to op names",
    ),
    (
        _with_backward("{input: nope}"),
        "relu backward ops input: 'nope' is not an op",
    ),
    (
        _with_backward("{input: relu}"),
        "relu backward ops input: 'relu' takes ['input']; expected ['grad_output', 'input']",
    ),
    (GOOD + GOOD.split("ops:\n")[1], "duplicate keys ['relu']"),
    ("kind: ops\nops: [1, 2]", "must be a mapping"),
    ("kind: ops\nops: {relu: {signature: [", "cannot be read as YAML"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_spec_fails_loudly(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    tags = REG.tags
    tag_file = tmp_path / "tags.yaml"
    tag_file.write_text("kind: tags\ntags:\n" + "".join(f"  {t}: x\n" for t in tags))
    with pytest.raises(SpecError, match="broken.yaml") as info:
        load([tag_file, path])
    assert message in str(info.value)


def test_good_spec_loads(tmp_path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    reg = load([tmp_path / "good.yaml"])
    assert reg.op("relu").signature.args[0].name == "input"


def test_other_kinds_have_room(tmp_path) -> None:
    """Fusion patterns, quant schemes, layouts and optimizer updates load, cross-checked."""
    (tmp_path / "ops.yaml").write_text(GOOD)
    (tmp_path / "fusions.yaml").write_text(
        textwrap.dedent("""
        kind: fusions
        fusions:
          relu_relu: {pattern: {op: relu, input: {op: relu, input: $x}}}
    """)
    )
    (tmp_path / "quant.yaml").write_text(
        textwrap.dedent("""
        kind: quant_schemes
        quant_schemes:
          u8_per_tensor: {dtype: uint8, granularity: per_tensor, symmetric: false}
    """)
    )
    (tmp_path / "layouts.yaml").write_text(
        textwrap.dedent("""
        kind: layouts
        layouts:
          identity: {dtypes: [float32], block: [1, 1], pack: numpy:asarray, unpack: numpy:asarray}
    """)
    )
    (tmp_path / "optim.yaml").write_text(
        textwrap.dedent("""
        kind: optimizers
        optimizers:
          sgd:
            hyperparameters: {lr: {default: 0.1, range: [0.0, 1.0]}}
            state: []
            reference: numpy:subtract
    """)
    )
    reg = load(sorted(tmp_path.glob("*.yaml")))
    assert reg.fusions["relu_relu"].pattern.nodes() == 2
    assert reg.quant_schemes["u8_per_tensor"].dtype == "uint8"
    assert reg.layouts["identity"].block == (1, 1)
    assert reg.optimizers["sgd"].hyperparameters == {"lr": {"default": 0.1, "range": [0.0, 1.0]}}
    (tmp_path / "optim.yaml").write_text(
        "kind: optimizers\noptimizers:\n  sgd: {hyperparameters: {lr: 0.1}, state: [],"
        " reference: numpy:subtract}\n"
    )
    with pytest.raises(SpecError, match="hyperparameter 'lr': must be a mapping with a 'default'"):
        load(sorted(tmp_path.glob("*.yaml")))
    (tmp_path / "optim.yaml").unlink()
    (tmp_path / "fusions.yaml").write_text(
        "kind: fusions\nfusions:\n  f: {pattern: {op: relu, input: {op: nope, input: $x}}}\n"
    )
    with pytest.raises(
        SpecError, match="fusions.yaml: fusion 'f': pattern names unknown op 'nope'"
    ):
        load(sorted(tmp_path.glob("*.yaml")))


def test_fusion_rewrites_resolve_and_a_missing_module_fails(tmp_path) -> None:
    """The registry finds a rewrite's module without importing it (a graph pass imports torch);
    every shipped rewrite resolves to a callable, and a missing module fails at load."""
    for f in REG.fusions.values():
        if f.rewrite:
            assert callable(resolve(f.rewrite)), f.name
    (tmp_path / "ops.yaml").write_text(GOOD)
    (tmp_path / "fusions.yaml").write_text(
        "kind: fusions\nfusions:\n  f: {pattern: {op: relu, input: {op: relu, input: $x}},"
        " rewrite: 'refcore.passes.no_such_pass:fold'}\n"
    )
    with pytest.raises(SpecError, match="fusion 'f' rewrite: no module 'refcore.passes.no_such"):
        load(sorted(tmp_path.glob("*.yaml")))


def test_a_fusions_where_may_share_conditions_through_an_anchor(tmp_path) -> None:
    """A ``where`` entry that is a list (a YAML anchor's conditions) is spliced in place; any
    other shape is refused with the fusion named."""
    (tmp_path / "ops.yaml").write_text(GOOD)
    fusions = (
        "kind: fusions\nfusions:\n"
        "  f: {pattern: {op: relu, input: {op: relu, input: $x}}, where: &w [ndim(x) == 2]}\n"
        "  g: {pattern: {op: relu, input: {op: relu, input: $x}}, where: [*w, dtype(x) == x]}\n"
    )
    (tmp_path / "fusions.yaml").write_text(fusions)
    reg = load(sorted(tmp_path.glob("*.yaml")))
    assert reg.fusions["f"].where == ("ndim(x) == 2",)
    assert reg.fusions["g"].where == ("ndim(x) == 2", "dtype(x) == x")
    (tmp_path / "fusions.yaml").write_text(fusions.replace("[*w, dtype(x) == x]", "[[1]]"))
    with pytest.raises(SpecError, match="fusion 'g'.*where must be a list of condition strings"):
        load(sorted(tmp_path.glob("*.yaml")))


def test_registry_and_kernels_run_without_torch() -> None:
    """Loading the specs and running an op on the reference or native provider never imports
    torch: refcore's NumPy side stands alone (the AMX tests rely on it to own the tile state)."""
    code = textwrap.dedent("""
        import sys, numpy as np, refcore, refcore_native
        from refcore.provider import using_providers
        from refcore.registry import default_registry
        default_registry()
        x = np.ones((8, 16), np.float32)
        w = np.ones((4, 16), np.float32)
        # the onednn provider is torch's oneDNN: discovering it imports torch, so name the set
        with using_providers():
            refcore.run("linear", x, w, provider="reference")
        assert "torch" not in sys.modules, "loading the specs or the reference imported torch"
        with using_providers(refcore_native.make_provider()):
            refcore.run("linear", x, w, provider="native")
        assert "torch" not in sys.modules, "the native provider imported torch"
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("f(Tensor x", "does not match"),
        ("f(Tensor x, Tensor x) -> Tensor", "appears twice"),
        ("f(Tensor(int3) x) -> Tensor", "unknown dtypes"),
        ("f(float x=1.0, Tensor y) -> Tensor", "without default follows"),
        ("f(float x=nope) -> Tensor", "not a Python literal"),
        ("f(complex x) -> Tensor", "has type 'complex'"),
    ],
)
def test_bad_schema(text: str, message: str) -> None:
    with pytest.raises(schema.SchemaError, match=message):
        schema.parse(text)


def test_schema_round_trips() -> None:
    text = "f(Tensor(int32|int64) i, Tensor? w=None, *, int[2] stride=1, float? eps=None) -> Tensor"
    assert str(schema.parse(text)) == text
