"""Pipeline ops and ready-made pipelines: argument and order checks, the dicts sent to Rust,
and the Python classes and stubs against the op language the proto defines."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest

import stoker
from stoker import _native, ops, vision
from stoker.ops import (
    CenterCrop,
    DecodeImage,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
    check_pipeline,
)


def test_sizes_accept_int_or_pair_like_torchvision() -> None:
    assert RandomResizedCrop(224).size == (224, 224)
    assert RandomResizedCrop((200, 300)).size == (200, 300)
    assert CenterCrop([7]).size == (7, 7)
    assert CenterCrop((5, 9)).to_dict() == {"op": "center_crop", "height": 5, "width": 9}


def test_to_dict_matches_the_native_contract() -> None:
    assert DecodeImage().to_dict() == {
        "op": "decode_image",
        "max_pixels": 0,
        "allow_dct_scaling": False,
    }
    assert DecodeImage(1000, dct_scaling=True).to_dict() == {
        "op": "decode_image",
        "max_pixels": 1000,
        "allow_dct_scaling": True,
    }
    assert RandomResizedCrop(8, scale=(0.5, 1), ratio=(1, 2)).to_dict() == {
        "op": "random_resized_crop",
        "height": 8,
        "width": 8,
        "scale_min": 0.5,
        "scale_max": 1.0,
        "ratio_min": 1.0,
        "ratio_max": 2.0,
    }
    assert Resize(256).to_dict() == {"op": "resize", "shorter_side": 256}
    assert RandomHorizontalFlip().to_dict() == {"op": "random_horizontal_flip", "p": 0.5}
    assert Normalize((0.5, 0.5, 0.5), [0.25, 0.5, 1]).to_dict() == {
        "op": "normalize",
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.5, 1.0],
    }
    assert ToTensor("NCHW", "float32").to_dict() == {
        "op": "to_tensor",
        "layout": "NCHW",
        "dtype": "float32",
    }


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: DecodeImage(max_pixels=0), "max_pixels"),
        (lambda: DecodeImage(max_pixels=-5), "max_pixels"),
        (lambda: DecodeImage(max_pixels=1.5), "max_pixels"),
        (lambda: DecodeImage(dct_scaling="yes"), "dct_scaling"),
        (lambda: RandomResizedCrop(0), "size"),
        (lambda: RandomResizedCrop(16_385), "1..=16384"),
        (lambda: RandomResizedCrop((10, 0)), "width"),
        (lambda: RandomResizedCrop((1, 2, 3)), "size"),
        (lambda: RandomResizedCrop("224"), "size"),
        (lambda: RandomResizedCrop(True), "size"),
        (lambda: RandomResizedCrop(8, scale=(0.9, 0.1)), "scale"),
        (lambda: RandomResizedCrop(8, scale=(0.1, 1.5)), "scale"),
        (lambda: RandomResizedCrop(8, scale=(-0.1, 0.5)), "scale"),
        (lambda: RandomResizedCrop(8, scale=(0.1, float("nan"))), "scale"),
        (lambda: RandomResizedCrop(8, scale=0.5), "scale"),
        (lambda: RandomResizedCrop(8, ratio=(0, 1)), "ratio"),
        (lambda: RandomResizedCrop(8, ratio=(2, 1)), "ratio"),
        # (0, 0) would read as "unset", torchvision's default range: refused, not reinterpreted.
        (lambda: RandomResizedCrop(8, scale=(0, 0)), "scale upper bound must be above 0"),
        (lambda: RandomResizedCrop(8, ratio=(0, 0)), "ratio upper bound must be above 0"),
        # So would a bound that rounds to 0 as the float32 it travels as.
        (lambda: RandomResizedCrop(8, scale=(0, 1e-46)), "scale upper bound must be above 0"),
        (lambda: RandomResizedCrop(8, ratio=(1e-46, 1e-46)), "ratio upper bound must be above"),
        (lambda: Resize(0), "Resize size"),
        (lambda: Resize((224, 224)), "Resize size"),
        (lambda: CenterCrop(-1), "CenterCrop height"),
        (lambda: CenterCrop("8"), "CenterCrop size"),
        (lambda: RandomHorizontalFlip(1.5), "p"),
        (lambda: RandomHorizontalFlip(-0.1), "p"),
        (lambda: RandomHorizontalFlip("0.5"), "p"),
        (lambda: Normalize((0.5, 0.5), (1, 1, 1)), "mean"),
        (lambda: Normalize((0.5, 0.5, 0.5), (1, 0, 1)), "std"),
        # A subnormal std, not 0, made infinities.
        (lambda: Normalize((0.5, 0.5, 0.5), (0.5, 1e-40, 0.5)), "std must be finite and non-zero"),
        (lambda: Normalize((0.5, 0.5, float("inf")), (1, 1, 1)), "mean"),
        (lambda: Normalize("abc", (1, 1, 1)), "mean"),
        # mmpretrain's statistics, on the 0..255 scale: refused, the pixels are on [0, 1].
        (lambda: Normalize((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)), "by 255"),
        (lambda: Normalize((0.5, 0.5, 0.5), (2, 2, 2)), "at most 1"),
        (lambda: ToTensor("HWC"), "layout"),
        (lambda: ToTensor("NHWC", "float16"), "dtype"),
    ],
)
def test_bad_op_arguments_raise_value_errors_naming_them(make: Any, names: str) -> None:
    with pytest.raises(stoker.PipelineError, match=names):
        make()


def test_decode_image_is_prepended_when_missing() -> None:
    checked = check_pipeline([RandomResizedCrop(8)])
    assert checked == [DecodeImage(), RandomResizedCrop(8)]
    full = [DecodeImage(dct_scaling=True), CenterCrop(8)]
    assert check_pipeline(full) == full


@pytest.mark.parametrize(
    "pipeline",
    [
        [
            DecodeImage(),
            RandomResizedCrop(8),
            RandomHorizontalFlip(),
            Normalize((0, 0, 0), (1, 1, 1)),
            ToTensor("NCHW", "float32"),
        ],
        [Resize(10), CenterCrop(8)],
        [CenterCrop(8), ToTensor("NCHW")],
        [RandomResizedCrop(8), Normalize((0, 0, 0), (1, 1, 1))],
        vision.imagenet_train(),
        vision.imagenet_eval(),
    ],
)
def test_supported_orders_pass(pipeline: list[ops.Op]) -> None:
    assert isinstance(check_pipeline(pipeline)[0], DecodeImage)


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ([], "after DecodeImage comes"),
        ([RandomHorizontalFlip(), RandomResizedCrop(8)], "after DecodeImage comes"),
        ([Resize(10)], "Resize alone"),
        ([RandomResizedCrop(8), CenterCrop(8)], "CenterCrop is out of place"),
        (
            [CenterCrop(8), ToTensor(), RandomHorizontalFlip()],
            "RandomHorizontalFlip is out of place",
        ),
        (
            [CenterCrop(8), RandomHorizontalFlip(), RandomHorizontalFlip()],
            "out of place or repeated",
        ),
        ([CenterCrop(8), DecodeImage()], "DecodeImage is out of place"),
        ([CenterCrop(8), Normalize((0, 0, 0), (1, 1, 1)), ToTensor(dtype="uint8")], "contradicts"),
    ],
)
def test_bad_orders_raise_value_errors_naming_the_supported_ones(
    pipeline: list[ops.Op], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        check_pipeline(pipeline)
    if "contradicts" not in message:
        assert "supported orders" in str(raised.value)


@pytest.mark.parametrize(
    "pipeline", ["imagenet", RandomResizedCrop(8), [RandomResizedCrop(8), lambda x: x], None]
)
def test_pipeline_must_be_a_list_of_ops(pipeline: Any) -> None:
    with pytest.raises(ValueError, match="pipeline"):
        check_pipeline(pipeline)


def test_vision_recipes() -> None:
    assert vision.imagenet_train(128) == [
        DecodeImage(dct_scaling=True),
        RandomResizedCrop(128),
        RandomHorizontalFlip(),
        ToTensor(),
    ]
    assert vision.imagenet_eval(224) == [DecodeImage(), Resize(256), CenterCrop(224), ToTensor()]
    with pytest.raises(ValueError, match="imagenet_eval size"):
        vision.imagenet_eval(0)
    with pytest.raises(ValueError, match="imagenet_train size"):
        vision.imagenet_train((224, 224))  # type: ignore[arg-type]


# One valid instance of each op class: a new op in the proto fails the schema tests until it
# has a class here (and in stoker.ops and the stubs).
EXAMPLES: dict[str, ops.Op] = {
    op.to_dict()["op"]: op
    for op in [
        DecodeImage(),
        RandomResizedCrop(8),
        Resize(8),
        CenterCrop(8),
        RandomHorizontalFlip(),
        Normalize((0, 0, 0), (1, 1, 1)),
        ToTensor(),
        ops.TokenWindows(8),
        ops.Tokenize("tokenizer.json"),
        ops.PackSequences(8),
        ops.SelectColumns(["x"]),
    ]
}


def _schema() -> dict[str, Any]:
    return {op["name"]: op for op in _native.op_schema()}


def test_every_proto_op_has_a_class_sending_each_of_its_fields() -> None:
    for name, schema in _schema().items():
        assert schema["message"] in ops.__all__, f"stoker.ops lacks the op {schema['message']}"
        cls = getattr(ops, schema["message"])
        assert cls.proto_name == name
        assert name in EXAMPLES, f"no {schema['message']} example in this test"
        sent = set(EXAMPLES[name].to_dict()) - {"op"}
        fields = {field["name"] for field in schema["fields"]}
        assert sent == fields, f"{schema['message']}.to_dict() sends {sent}, the proto has {fields}"
        assert cls.__doc__, f"{schema['message']} has no docstring"
    assert set(EXAMPLES) == set(_schema()), "an op class has no op in the proto"


def test_the_stubs_declare_every_op_dict_with_the_proto_fields() -> None:
    stubs = Path(_native.__file__).with_name("_native.pyi")
    if not stubs.exists():  # an installed wheel next to a source checkout
        stubs = Path(ops.__file__).with_name("_native.pyi")
    declared: dict[str, dict[str, str]] = {}
    for node in ast.parse(stubs.read_text()).body:
        if isinstance(node, ast.ClassDef) and any(
            isinstance(base, ast.Name) and base.id == "TypedDict" for base in node.bases
        ):
            fields = {
                item.target.id: ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            if fields.get("op", "").startswith("Literal["):
                declared[ast.literal_eval(fields.pop("op")[len("Literal[") : -1])] = fields
    for name, schema in _schema().items():
        assert name in declared, f"_native.pyi lacks the TypedDict of {name!r}"
        fields = {field["name"]: field for field in schema["fields"]}
        assert set(declared[name]) == set(fields), (
            f"_native.pyi's {name!r} has {sorted(declared[name])}, the proto {sorted(fields)}"
        )
        for field_name, annotation in declared[name].items():
            repeated = fields[field_name]["repeated"]
            assert annotation.startswith("list[") == repeated, (
                f"{name}.{field_name}: {annotation} (repeated in the proto: {repeated})"
            )
    assert set(declared) == set(_schema()), "_native.pyi declares an op the proto lacks"


def test_the_schema_reads_the_proto_comments() -> None:
    schema = _schema()
    assert list(schema)[:2] == ["decode_image", "random_resized_crop"]
    crop = schema["random_resized_crop"]
    assert "torchvision" in crop["doc"]
    assert [f["name"] for f in crop["fields"]][:2] == ["height", "width"]
    dtype = next(f for f in schema["to_tensor"]["fields"] if f["name"] == "dtype")
    assert dtype["type"] == "Dtype" and "FLOAT32" in dtype["values"]


def test_native_checks_name_the_op_and_field() -> None:
    with pytest.raises(stoker.PipelineError, match='unknown op "blur"'):
        _native.check_op({"op": "blur"})
    with pytest.raises(stoker.PipelineError, match='Resize has no argument "size"'):
        _native.check_op({"op": "resize", "size": 8})
    with pytest.raises(stoker.PipelineError, match="op 1: ToTensor dtype"):
        _native.check_pipeline(
            [{"op": "center_crop", "height": 8, "width": 8}, {"op": "to_tensor", "dtype": 3.5}]
        )
    # Enum values by name in any case; the native check is the workers' own.
    assert _native.check_pipeline(
        [{"op": "center_crop", "height": 8, "width": 8}, {"op": "to_tensor", "layout": "nchw"}]
    )
    assert not _native.check_pipeline([{"op": "token_windows", "seq_len": 8}])


def test_the_python_surface_only_shapes_arguments() -> None:
    # The constants the checks use come from Rust; the orders are the workers' messages.
    assert ops.SUPPORTED_ORDERS == _native.IMAGE_ORDERS
    assert ops.MAX_SIDE == 16_384
    assert ops.Tokenize(Path("a") / "tokenizer.json").tokenizer_path == os.path.join(
        "a", "tokenizer.json"
    )
    with pytest.raises(stoker.PipelineError, match="Tokenize tokenizer_path must be a string"):
        ops.Tokenize(3)  # type: ignore[arg-type]
    with pytest.raises(stoker.PipelineError, match="Tokenize needs tokenizer_path"):
        ops.Tokenize("")
    with pytest.raises(stoker.PipelineError, match='column "x" twice'):
        ops.SelectColumns(["x", "y", "x"])
    with pytest.raises(stoker.PipelineError, match="SelectColumns dtype"):
        ops.SelectColumns(["x"], dtype="uint8")
    with pytest.raises(stoker.PipelineError, match="supported token pipelines"):
        check_pipeline([ops.PackSequences(8), ops.Tokenize("t.json")])


def test_numpy_and_torch_numbers_are_taken_as_numbers() -> None:
    """Statistics and sizes often come as numpy or torch values: taken as the numbers they
    hold, a bool still refused."""
    np = pytest.importorskip("numpy")
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    assert Normalize(mean, (0.229, 0.224, 0.225)).to_dict()["mean"] == [float(m) for m in mean]
    assert RandomResizedCrop(np.int64(8)).size == (8, 8)
    assert Resize(np.int64(256)).to_dict()["shorter_side"] == 256
    assert CenterCrop((np.int64(8), 9)).size == (8, 9)
    assert RandomHorizontalFlip(np.float32(0.25)).p == 0.25
    torch = pytest.importorskip("torch")
    std = torch.tensor([0.229, 0.224, 0.225])
    assert Normalize((0.5, 0.5, 0.5), std).to_dict()["std"] == [float(s) for s in std]
    with pytest.raises(stoker.PipelineError, match="size"):
        RandomResizedCrop(np.bool_(True))


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ops.PackSequences(8, eos_id=None), "eos_id"),
        (lambda: RandomHorizontalFlip(None), "p"),
        (lambda: RandomResizedCrop(8, scale=(None, 0.5)), "scale_min"),
        (lambda: ops.TokenWindows(None), "seq_len"),
    ],
)
def test_none_where_an_op_takes_no_default_is_refused(make: Any, field: str) -> None:
    """The wire reads an unset field as 0: ``eos_id=None`` (a tokenizer's ``eos_token_id``
    that is ``None``) packed token id 0 as EOS, ``RandomHorizontalFlip(None)`` never flipped."""
    with pytest.raises(stoker.PipelineError, match=f"{field} must be given"):
        make()


def test_numpy_numbers_are_taken_as_pythons_by_every_op() -> None:
    np = pytest.importorskip("numpy")
    assert ops.TokenWindows(np.int64(8)) == ops.TokenWindows(8)
    assert ops.PackSequences(8, eos_id=np.int32(3)) == ops.PackSequences(8, eos_id=3)
    assert DecodeImage(max_pixels=np.int64(1000)) == DecodeImage(1000)
    assert RandomHorizontalFlip(np.float32(0.25)) == RandomHorizontalFlip(0.25)
    # Equal ops hash alike (a set of ops, a dict keyed by them).
    assert len({ops.TokenWindows(8), ops.TokenWindows(np.int64(8))}) == 1


def test_to_tensor_defaults_follow_normalize() -> None:
    """``ToTensor()`` after a Normalize is float32 (its uint8 default was refused there, with
    a hint to leave unset what the signature could not), in the layout it names (NHWC by
    default), as the device stage reads it. Names it does not take are refused by name."""
    norm = Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    for tail, shape, dtype in [
        ([ToTensor()], (8, 8, 3), "uint8"),
        ([norm], (3, 8, 8), "float32"),
        ([norm, ToTensor()], (8, 8, 3), "float32"),
        ([norm, ToTensor("NCHW")], (3, 8, 8), "float32"),
        ([ToTensor("NCHW")], (3, 8, 8), "uint8"),
    ]:
        chain = [DecodeImage(), CenterCrop(8), *tail]
        pipeline = _native.ImagePipeline([op.to_dict() for op in chain])
        assert (tuple(pipeline.shape), pipeline.dtype) == (shape, dtype), tail
    for bad in [dict(dtype="unspecified"), dict(layout="CHW"), dict(dtype=3), dict(layout=None)]:
        with pytest.raises(stoker.PipelineError, match="ToTensor"):
            ToTensor(**bad)
