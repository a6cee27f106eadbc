"""Attribute docstrings: the string literal under a class attribute, read from the source."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated attribute of ``cls`` (a dataclass's fields), its
    whitespace folded; attributes without one are left out."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs
