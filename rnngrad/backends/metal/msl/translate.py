"""MSL source → the pieces every harness target needs: parse, rewrite, describe the kernels.

Shared by the CPU and CUDA targets. The source is compiled unchanged except for line-preserving
rewrites: the function-like macros named ``instantiate_*``, which stamp out entry points, are
expanded (:func:`expand`) so that every tool sees those entry points' signatures; ``#include
<metal_stdlib>`` (and the other ``<metal_*>`` headers) include the stand-in header; ``const
constant`` collapses to ``constant``; each kernel-scope ``threadgroup T name[N]...;`` declaration
becomes what the target says (a reference into the CPU arena, a ``__shared__`` array on CUDA).
:func:`kernels` describes every ``kernel void`` entry point: its ``[[buffer(i)]]`` and builtin
parameters, its ``max_total_threads_per_threadgroup`` and whether it synchronises (a barrier or
SIMD collective in its body or any function it calls). Each target then generates its own launchers
from those descriptions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SOURCE_NAME = "program.metal"

#: builtin attribute → whether its value is a size (1 in the unused components of a vector)
#: rather than a position (0 there); the grid is 1-D
BUILTINS = {
    "thread_position_in_grid": False,
    "thread_position_in_threadgroup": False,
    "thread_index_in_threadgroup": False,
    "threadgroup_position_in_grid": False,
    "threads_per_threadgroup": True,
    "threadgroups_per_grid": True,
    "threads_per_grid": True,
    "thread_index_in_simdgroup": False,
    "simdgroup_index_in_threadgroup": False,
    "threads_per_simdgroup": True,
    "thread_execution_width": True,
    "simdgroups_per_threadgroup": True,
}
# Calls that need every GPU thread of a threadgroup (or SIMD-group) to be able to pause.
_SYNC = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+)\b")
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "catch"}


class CompileError(Exception):
    """The source does not compile, or uses something the harness cannot run."""


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its C++ type and name, and ``buffer`` (with the index) or the name
    of a builtin."""
    type: str
    name: str
    kind: str
    index: int = -1


@dataclass(frozen=True)
class KernelInfo:
    name: str
    n_buffers: int            # highest [[buffer(i)]] + 1: buffers the call must pass
    needs_fibers: bool        # synchronises (barrier or SIMD collective)
    params: tuple = ()        # (Param, ...) in declaration order
    max_threads: str = "1024"  # C++ expression of max_total_threads_per_threadgroup


def mask(src: str, strings: bool = True) -> str:
    """The source with comments and (``strings``) string/char literals blanked (same length,
    same lines)."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            if not strings:
                i = j
                continue
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def _match(text: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise CompileError(f"{SOURCE_NAME}:{line_of(text, i)}: unbalanced '{open_}'")


def line_of(text: str, i: int) -> int:
    return text.count("\n", 0, i) + 1


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for j, c in enumerate(text):
        if c in "([<":
            depth += 1
        elif c in ")]>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _functions(masked: str) -> dict[str, list[tuple[int, int]]]:
    """Function name -> body spans, for every function definition in the source."""
    found: dict[str, list[tuple[int, int]]] = {}
    for m in re.finditer(r"\b(\w+)\s*\(", masked):
        name = m.group(1)
        if name in _KEYWORDS:
            continue
        try:
            close = _match(masked, m.end() - 1, "(", ")")
            rest = re.match(r"(?:\s|const\b|noexcept\b|\[\[[^\]]*\]\])*\{", masked[close:])
            if rest:
                body = close + rest.end() - 1
                found.setdefault(name, []).append((body, _match(masked, body, "{", "}")))
        except CompileError:
            continue  # unbalanced text (e.g. inside a macro): the compiler will judge it
    return found


def _synchronises(masked: str, body: tuple[int, int], functions) -> bool:
    """Whether a body, or any function it names (transitively), uses a barrier or collective."""
    seen, stack = set(), [body]
    while stack:
        span = stack.pop()
        if span in seen:
            continue
        seen.add(span)
        text = masked[span[0]:span[1]]
        if _SYNC.search(text):
            return True
        for ident in set(re.findall(r"\b\w+\b", text)):
            stack.extend(functions.get(ident, ()))
    return False


_TG_TYPE = r"[A-Za-z_][\w:]*(?:\s*<[^;{}>]*>)?"


def rewrite_threadgroup(src: str, replace) -> str:
    """Each kernel-scope ``threadgroup T name[N]...;`` → ``replace(T, name, "[N]...")`` (text on
    one line; the declaration's line breaks are kept after it)."""
    masked = mask(src)
    decl = re.compile(r"(?<![\w])threadgroup\s+(" + _TG_TYPE + r")\s+([A-Za-z_]\w*)\s*"
                      r"((?:\[[^\];]*\]\s*)*);")
    pieces, last = [], 0
    for m in decl.finditer(masked):
        before = masked[:m.start()].rstrip()
        if before and before[-1] not in ";{}":
            continue
        type_, name, dims = m.group(1), m.group(2), re.sub(r"\s+", "", m.group(3))
        text = replace(type_, name, dims) + "\n" * src[m.start():m.end()].count("\n")
        pieces += [src[last:m.start()], text]
        last = m.end()
    pieces.append(src[last:])
    out = "".join(pieces)
    rest = re.search(r"(?<![\w])threadgroup\s+" + _TG_TYPE + r"\s+[A-Za-z_]\w*\s*[\[;,=]", mask(out))
    if rest:
        raise CompileError(
            f"{SOURCE_NAME}:{line_of(out, rest.start())}: unsupported threadgroup declaration "
            f"'{out[rest.start():rest.end()].strip()}...': declare one threadgroup variable per "
            f"statement, at kernel scope, without an initializer")
    return out


#: the name prefix of the function-like macros :func:`expand` expands: macros that stamp out
#: entry points (MLX's ``instantiate_kernel`` habit), whose signatures every tool must see
INSTANTIATE = "instantiate_"
_DEFINE = re.compile(r"(?m)^[ \t]*#[ \t]*define[ \t]+(" + INSTANTIATE + r"\w*)\(([^)]*)\)")


def _args(masked: str, code: str, open_: int) -> tuple[list[str], int]:
    """The arguments (from ``code``) of a macro call whose ``(`` is at ``open_`` in ``masked``
    (only parentheses nest, as in the C preprocessor), and the index past its ``)``."""
    close = _match(masked, open_, "(", ")")
    args, depth, start = [], 0, open_ + 1
    for j in range(open_ + 1, close - 1):
        if masked[j] == "(":
            depth += 1
        elif masked[j] == ")":
            depth -= 1
        elif masked[j] == "," and depth == 0:
            args.append(code[start:j])
            start = j + 1
    args.append(code[start:close - 1])
    return [" ".join(a.split()) for a in args], close


def expand(src: str) -> str:
    """The source with each ``instantiate_*`` function-like macro (:data:`INSTANTIATE`) expanded
    where it is called, as the C preprocessor would, and its ``#define`` blanked: the text in
    which every tool finds the entry points the macros stamp out. Lines are kept: an expansion
    takes one line, then the call's line breaks. Comments are dropped; a macro body may not use
    ``#`` or ``##``."""
    masked, code = mask(src), mask(src, strings=False)
    macros, out, last = {}, [], 0
    for m in _DEFINE.finditer(masked):
        eol = m.end()
        while True:  # the logical line: physical lines joined by a backslash at their end
            eol = masked.find("\n", eol)
            eol = len(masked) if eol < 0 else eol
            start = src.rfind("\n", 0, eol) + 1
            if not src[start:eol].rstrip(" \t").endswith("\\"):
                break
            if not masked[start:eol].rstrip(" \t").endswith("\\"):
                raise CompileError(f"{SOURCE_NAME}:{line_of(src, eol)}: a // comment in the "
                                   f"#define of {m.group(1)} swallows the line after it: use /* */")
            eol += 1
        if "#" in masked[m.end():eol]:
            raise CompileError(f"{SOURCE_NAME}:{line_of(src, m.start())}: {m.group(1)}: # and ## "
                               f"are not supported in an {INSTANTIATE}* macro")
        body = " ".join(code[m.end():eol].replace("\\\n", " ").split())
        macros[m.group(1)] = ([p.strip() for p in m.group(2).split(",")], body)
        out += [src[last:m.start()], "\n" * src.count("\n", m.start(), eol)]
        last = eol
    if not macros:
        return src
    src = "".join(out + [src[last:]])
    calls = re.compile(r"\b(" + "|".join(map(re.escape, macros)) + r")\s*\(")

    def substitute(name: str, args: list[str], line: int, active: frozenset) -> str:
        params, body = macros[name]
        named = params[:-1] if params[-1] == "..." else params
        if len(args) != len(named) and not (named != params and len(args) >= len(named)):
            raise CompileError(f"{SOURCE_NAME}:{line}: {name} takes {len(named)} argument(s)"
                               f"{' or more' if named != params else ''}, got {len(args)}")
        values = dict(zip(named, args), __VA_ARGS__=", ".join(args[len(named):]))
        pieces, last = [], 0
        for t in re.finditer(r"\b[A-Za-z_]\w*\b", mask(body)):  # not within a literal
            pieces += [body[last:t.start()], values.get(t.group(0), t.group(0))]
            last = t.end()
        return calls_in("".join(pieces + [body[last:]]), line, active | {name})

    def calls_in(text: str, line: int | None, active: frozenset) -> str:
        """``text`` with its calls expanded; line None: ``text`` is the source, whose line
        breaks each call keeps, else one line of an expansion at ``line``."""
        masked, code = mask(text), mask(text, strings=False)
        pieces, last = [], 0
        for call in calls.finditer(masked):
            if call.start() < last or call.group(1) in active:
                continue
            args, close = _args(masked, code, call.end() - 1)
            at = line_of(text, call.start()) if line is None else line
            breaks = "\n" * text.count("\n", call.start(), close) if line is None else ""
            pieces += [text[last:call.start()], substitute(call.group(1), args, at, active) + breaks]
            last = close
        return "".join(pieces + [text[last:]])

    return calls_in(src, None, frozenset())


def prepare(source: str) -> str:
    """The rewrites every target makes before its own: the ``instantiate_*`` macros expanded
    (:func:`expand`), the stand-in header, ``const constant``."""
    src = re.sub(r"#\s*include\s*<(?:metal_\w+|simd/simd\.h)>", '#include "metal_stdlib.h"',
                 expand(source))
    return re.sub(r"\bconst\s+constant\b|\bconstant\s+const\b", "constant", src)


def kernels(src: str) -> list[KernelInfo]:
    """Every ``kernel void`` entry point of a (prepared) source, with its parameters."""
    masked = mask(src)
    functions = _functions(masked)
    hidden_sync = any(_SYNC.search(line) for line in masked.splitlines()
                      if line.lstrip().startswith("#define"))  # a macro may hide a barrier
    found = []
    pattern = re.compile(r"(?:\bkernel|\[\[\s*kernel\s*\]\])\s+void\s+([A-Za-z_]\w*)\s*\(")
    for m in pattern.finditer(masked):
        name = m.group(1)
        open_ = m.end() - 1
        close = _match(masked, open_, "(", ")")
        brace = masked.find("{", close)
        if brace < 0:
            raise CompileError(f"{SOURCE_NAME}:{line_of(src, m.start())}: kernel '{name}' has no body")
        head_start = max(masked.rfind(";", 0, m.start()), masked.rfind("}", 0, m.start())) + 1
        head = masked[head_start:m.start()] + " " + masked[close:brace]
        limit = re.search(r"max_total_threads_per_threadgroup\s*\(", head)
        max_threads = "1024"
        if limit:
            max_threads = head[limit.end():_match(head, limit.end() - 1, "(", ")") - 1].strip()
        params, n_buffers = [], 0
        line = line_of(src, open_)
        for piece in _split_params(src[open_ + 1:close - 1]):
            attr = re.search(r"\[\[\s*(\w+)\s*(?:\(\s*([^)]*)\))?\s*\]\]", piece)
            decl = re.sub(r"\[\[.*?\]\]", " ", piece, flags=re.S).strip()
            pname = re.search(r"([A-Za-z_]\w*)\s*$", decl)
            if not attr or not pname:
                raise CompileError(
                    f"{SOURCE_NAME}:{line}: parameter '{' '.join(piece.split())}' of kernel "
                    f"'{name}' has no attribute: every kernel parameter needs [[buffer(i)]] or "
                    f"a builtin such as [[thread_position_in_grid]]")
            type_ = decl[:pname.start()].strip()
            kind, value = attr.group(1), attr.group(2)
            if kind == "buffer":
                index = int(value, 0)
                n_buffers = max(n_buffers, index + 1)
                params.append(Param(type_, pname.group(1), "buffer", index))
            elif kind in BUILTINS:
                params.append(Param(type_, pname.group(1), kind))
            elif kind == "threadgroup":
                raise CompileError(
                    f"{SOURCE_NAME}:{line}: kernel '{name}' takes a [[threadgroup({value})]] "
                    f"argument; metalcompute cannot set threadgroup memory lengths, so declare "
                    f"threadgroup arrays in the kernel body")
            else:
                raise CompileError(
                    f"{SOURCE_NAME}:{line}: kernel '{name}': attribute [[{kind}]] is not "
                    f"supported by the harness (expected buffer(i) or one of "
                    f"{', '.join(sorted(BUILTINS))})")
        body = (brace, _match(masked, brace, "{", "}"))
        needs_fibers = hidden_sync or _synchronises(masked, body, functions)
        found.append(KernelInfo(name, n_buffers, needs_fibers, tuple(params), max_threads))
    return found
