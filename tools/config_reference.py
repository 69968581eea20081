"""The configuration reference, generated from the config structs.

``python tools/config_reference.py en > docs/en/config-reference.md`` (and ``zh``).
Keys, types, constraints and defaults come from :mod:`queue_rollout.config` itself, and
so does each key's meaning in English: the ``#:`` comment above its field. The Chinese
meanings are data beside the Chinese pages (``docs/zh/config-meanings.toml``). A test
fails when a key lacks a meaning in either language, or when the pages in ``docs/``
differ from what this prints. Not part of the package: nothing at run time needs it.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from queue_rollout import config
from queue_rollout.config import Config

ROOT = Path(__file__).resolve().parents[1]
#: The Chinese meanings, as data beside the Chinese pages.
ZH_MEANINGS = ROOT / "docs" / "zh" / "config-meanings.toml"


def english_meanings() -> dict[str, str]:
    """"section.key" -> the ``#:`` comment above the field in the config structs."""
    source = inspect.getsource(config)
    lines = source.splitlines()
    prefixes = {struct.__name__: name for name, struct in _section_structs().items()}
    meanings: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ClassDef) and node.name in prefixes):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                above: list[str] = []
                i = item.lineno - 2
                while i >= 0 and lines[i].strip().startswith("#:"):
                    above.insert(0, lines[i].strip()[2:].strip())
                    i -= 1
                if above:
                    meanings[f"{prefixes[node.name]}.{item.target.id}"] = " ".join(above)
    return meanings


def chinese_meanings() -> dict[str, str]:
    with ZH_MEANINGS.open("rb") as f:
        return {key: str(value) for key, value in tomllib.load(f).items()}


def meanings(lang: str) -> dict[str, str]:
    return english_meanings() if lang == "en" else chinese_meanings()


def _table(t: Any) -> type | None:
    """The struct of a table (a struct field) or of an array of tables (a list of
    structs, as ``[[cells]]``); None for a value."""
    if isinstance(t, msgspec.inspect.ListType):
        t = t.item_type
    return t.cls if isinstance(t, msgspec.inspect.StructType) else None


def _section_structs(struct: type = Config, prefix: str = "") -> dict[str, type]:
    """TOML table name -> its struct, nested tables included."""
    out: dict[str, type] = {}
    info = msgspec.inspect.type_info(struct)
    if not isinstance(info, msgspec.inspect.StructType):
        raise TypeError(f"{struct!r} is not a struct")
    for field in info.fields:
        if (cls := _table(field.type)) is not None:
            out[f"{prefix}{field.name}"] = cls
            out.update(_section_structs(cls, f"{prefix}{field.name}."))
    return out


TITLE = {"en": ("Configuration reference", "key", "type", "default", "meaning",
                "Generated from the config structs by `python tools/config_reference.py en`; "
                "unknown keys are refused. See [Configuration](configuration.md) for the file "
                "as a whole."),
         "zh": ("配置参考", "键", "类型", "默认值", "含义",
                "由 `python tools/config_reference.py zh` 从配置结构体生成；未知键会被拒绝。"
                "整体说明见[配置](configuration.md)。")}


def _type(t: Any) -> str:
    """A type with its constraints, e.g. ``int > 0``, ``int > 0 | "auto" | unset``."""
    if isinstance(t, msgspec.inspect.UnionType):
        return " \\| ".join(_type(x) for x in t.types)
    if isinstance(t, msgspec.inspect.NoneType):
        return "unset"
    if isinstance(t, msgspec.inspect.LiteralType):
        return " \\| ".join(json.dumps(v) for v in t.values)
    if isinstance(t, msgspec.inspect.ListType):
        return f"list of {_type(t.item_type)}"
    names: dict[type[msgspec.inspect.Type], str] = {
        msgspec.inspect.IntType: "int", msgspec.inspect.FloatType: "float",
        msgspec.inspect.StrType: "string", msgspec.inspect.BoolType: "bool"}
    name = names.get(type(t))
    if name is None:
        return type(t).__name__
    bounds = [f"{op} {getattr(t, attr)}" for attr, op in
              (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if getattr(t, attr, None) is not None]
    if getattr(t, "pattern", None):
        bounds.append("matching `" + t.pattern.replace("|", "\\|") + "`")
    return " ".join([name, ", ".join(bounds)]).strip()


def _default(field: Any, lang: str) -> str:
    if field.default is msgspec.NODEFAULT and field.default_factory is msgspec.NODEFAULT:
        return "required" if lang == "en" else "必填"
    if field.default is msgspec.NODEFAULT:
        value = field.default_factory()
        if isinstance(value, msgspec.Struct):
            return ""
    else:
        value = field.default
    return "unset" if value is None else f"`{json.dumps(value, ensure_ascii=False)}`"


def sections(struct: type = Config, prefix: str = "") -> list[tuple[str, list[tuple[str, Any]]]]:
    """(section name, [(key, field)]) for every TOML table, nested ones after."""
    own, nested = [], []
    info = msgspec.inspect.type_info(struct)
    if not isinstance(info, msgspec.inspect.StructType):
        raise TypeError(f"{struct!r} is not a struct")
    for field in info.fields:
        if (cls := _table(field.type)) is not None:
            nested += sections(cls, f"{prefix}{field.name}.")
        else:
            own.append((f"{prefix}{field.name}", field))
    return ([(prefix.rstrip("."), own)] if own else []) + nested


def _header(name: str) -> str:
    """``[farm]``, or ``[[cells]]`` for an array of tables."""
    info = msgspec.inspect.type_info(Config)
    assert isinstance(info, msgspec.inspect.StructType)
    arrays = {f.name for f in info.fields if isinstance(f.type, msgspec.inspect.ListType)}
    return f"[[{name}]]" if name in arrays else f"[{name}]"


def reference_markdown(lang: str) -> str:
    title, key_h, type_h, default_h, meaning_h, intro = TITLE[lang]
    meaning = meanings(lang)
    lines = [f"# {title}", "", intro, ""]
    for name, fields in sections():
        lines += [f"## {_header(name)}", "", f"| {key_h} | {type_h} | {default_h} | {meaning_h} |",
                  "|---|---|---|---|"]
        for key, field in fields:
            short = key.rsplit(".", 1)[-1]
            lines.append(f"| `{short}` | {_type(field.type)} | {_default(field, lang)} | "
                         f"{meaning[key]} |")
        lines.append("")
    return "\n".join(lines)


def config_keys() -> set[str]:
    """Every key of the configuration file, as "section.key"."""
    return {key for _, fields in sections() for key, _ in fields}


if __name__ == "__main__":
    sys.stdout.write(reference_markdown(sys.argv[1] if len(sys.argv) > 1 else "en"))
