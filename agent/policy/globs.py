"""Shell-style globs over package names and versions, as :func:`fnmatch.fnmatchcase` matches them, without ``re``.

The apt hook starts on every apt run, and importing ``re`` (with ``enum``) costs about as much as starting the
interpreter; package globs are nearly always a prefix (``rocm*``), a suffix (``*-dkms``) or a literal, which
``str`` methods decide. Everything else (``?``, ``[...]``, stars inside) goes through a small backtracking
matcher. The semantics are fnmatch's, ``[...]`` edge cases included (a ``[`` with no closing ``]`` is literal,
``[!...]`` negates, reversed ranges are empty); ``tests/policy/test_globs.py`` checks that against fnmatch on
generated patterns. Standard library only, no imports.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Callable, Dict, FrozenSet, List, Sequence, Tuple, Union

    # A token: a literal character, ANY_CHAR, STAR, or a class (negated, characters, (low, high) ranges).
    CharClass = Tuple[bool, FrozenSet[str], Tuple[Tuple[str, str], ...]]
    Token = Union[str, int, CharClass]

STAR = 0
ANY_CHAR = 1
_SPECIAL = frozenset("*?[")


def _class_chunks(pat: str, i: int, j: int) -> List[str]:
    """The pieces of the set ``pat[i:j]`` between range hyphens, empty ranges dropped, as fnmatch splits them."""
    if "-" not in pat[i:j]:
        return [pat[i:j]]
    chunks = []
    k = i + 2 if pat[i] == "!" else i + 1
    while True:
        k = pat.find("-", k, j)
        if k < 0:
            break
        chunks.append(pat[i:k])
        i = k + 1
        k = k + 3
    chunk = pat[i:j]
    if chunk:
        chunks.append(chunk)
    else:
        chunks[-1] += "-"
    for k in range(len(chunks) - 1, 0, -1):  # a range whose ends are reversed is empty: both ends go
        if chunks[k - 1][-1] > chunks[k][0]:
            chunks[k - 1] = chunks[k - 1][:-1] + chunks[k][1:]
            del chunks[k]
    return chunks


def _char_class(chunks: List[str]) -> CharClass:
    """A class from fnmatch's chunks: every character literal, a range between neighbouring chunks."""
    negated = chunks[0][:1] == "!"
    if negated:
        chunks = [chunks[0][1:]] + chunks[1:]
    chars = "".join(chunks)
    if len(chunks) > 1 and not chunks[0]:  # the set starts with a hyphen: a literal '-', not a range
        chunks, chars = chunks[1:], chars + "-"
    ranges = tuple((chunks[k - 1][-1], chunks[k][0]) for k in range(1, len(chunks)))
    return negated, frozenset(chars), ranges


def tokens(pattern: str) -> Tuple[Token, ...]:
    """The pattern as tokens, each matching one character except STAR (any run of characters)."""
    out: List[Token] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not out or out[-1] != STAR:
                out.append(STAR)
        elif c == "?":
            out.append(ANY_CHAR)
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append("[")
            else:
                out.append(_char_class(_class_chunks(pattern, i, j)))
                i = j + 1
        else:
            out.append(c)
    return tuple(out)


def _one(token: Token, char: str) -> bool:
    if token == ANY_CHAR:
        return True
    if isinstance(token, str):
        return token == char
    negated, chars, ranges = token  # type: ignore[misc]
    inside = char in chars or any(low <= char <= high for low, high in ranges)
    return inside != negated


def match_tokens(toks: Sequence[Token], text: str) -> bool:
    """Whether ``text`` matches the tokens (greedy with backtracking to the last star: O(len(text) * tokens))."""
    t = s = 0
    star_t, star_s = -1, 0
    nt, ns = len(toks), len(text)
    while s < ns:
        if t < nt and toks[t] == STAR:
            star_t, star_s = t, s
            t += 1
        elif t < nt and _one(toks[t], text[s]):
            t += 1
            s += 1
        elif star_t >= 0:
            star_s += 1
            s = star_s
            t = star_t + 1
        else:
            return False
    while t < nt and toks[t] == STAR:
        t += 1
    return t == nt


_CACHE: Dict[str, Callable[[str], bool]] = {}


def _compile(pattern: str) -> Callable[[str], bool]:
    if not _SPECIAL & set(pattern):
        return pattern.__eq__
    inner = pattern[:-1]
    if pattern.endswith("*") and not _SPECIAL & set(inner):
        return lambda text: text.startswith(inner)
    tail = pattern[1:]
    if pattern.startswith("*") and not _SPECIAL & set(tail):
        return lambda text: text.endswith(tail)
    toks = tokens(pattern)
    return lambda text: match_tokens(toks, text)


def glob_match(text: str, pattern: str) -> bool:
    """``fnmatch.fnmatchcase(text, pattern)``."""
    test = _CACHE.get(pattern)
    if test is None:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        test = _CACHE[pattern] = _compile(pattern)
    return test(text)


def _literal_head(pattern: str) -> str:
    """The characters before a pattern's first ``*``, ``?`` or ``[``."""
    for index, char in enumerate(pattern):
        if char in _SPECIAL:
            return pattern[:index]
    return pattern


def split_globs(patterns: Sequence[str]) -> Tuple[List[str], List[str], List[str], List[str]]:
    """The patterns as (literals, prefixes of ``prefix*``, suffixes of ``*suffix``, the rest), in order; a bare
    ``*`` is the empty prefix."""
    literals, prefixes, suffixes, others = [], [], [], []
    for pattern in patterns:
        if not _SPECIAL & set(pattern):
            literals.append(pattern)
        elif pattern.endswith("*") and not _SPECIAL & set(pattern[:-1]):
            prefixes.append(pattern[:-1])
        elif pattern.startswith("*") and not _SPECIAL & set(pattern[1:]):
            suffixes.append(pattern[1:])
        else:
            others.append(pattern)
    return literals, prefixes, suffixes, others


def any_glob(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A test of whether a text matches any of ``patterns``, built for being called once per installed package.

    Literals are one set lookup; prefixes (``rocm*``) are grouped by their leading characters, so a name is
    compared only with the prefixes that can match it (one ``str.startswith`` call); suffixes are one
    ``str.endswith`` call; the rest are matched one by one.
    """
    literal_list, prefix_list, suffix_list, other_list = split_globs(patterns)
    if "" in prefix_list:
        return lambda text: True
    literals = set(literal_list)
    # Other globs keep their literal beginning (``rocm-core`` of ``rocm-core[0-9]*``) as a cheap first test.
    others = [(_literal_head(pattern), tokens(pattern)) for pattern in other_list]
    # Prefixes grouped by their first ``head`` characters (the shortest prefix's length): most names share no
    # head with any prefix and cost one dict lookup; the rest one startswith over their group.
    head = min((len(p) for p in prefix_list), default=1)
    groups: Dict[str, List[str]] = {}
    for prefix in prefix_list:
        groups.setdefault(prefix[:head], []).append(prefix)
    prefixes = {key: tuple(group) for key, group in groups.items()}
    suffix = tuple(suffix_list)
    no_prefix: Tuple[str, ...] = ()

    def test(text: str) -> bool:
        return (text in literals or text.startswith(prefixes.get(text[:head], no_prefix)) or text.endswith(suffix)
                or any(text.startswith(head_text) and match_tokens(t, text) for head_text, t in others))

    if not others:  # the usual case: no loop at all
        return lambda text: (text in literals or text.startswith(prefixes.get(text[:head], no_prefix))
                             or text.endswith(suffix))
    return test


def matched_by_some(texts: Sequence[str]) -> Callable[[str], bool]:
    """A test of whether a pattern matches at least one of ``texts``, built for being called once per pattern (the
    other way round from :func:`any_glob`: ``policy check``'s "matches no package installed" over a policy that
    may list 100,000 names).

    A literal is one set lookup; ``prefix*`` and ``*suffix`` a binary search in the sorted texts (reversed for
    suffixes); only other globs go through every text.
    """
    from bisect import bisect_left

    known = set(texts)
    forward = sorted(known)
    backward = sorted(text[::-1] for text in known)

    def starts(ordered: List[str], head: str) -> bool:
        at = bisect_left(ordered, head)
        return at < len(ordered) and ordered[at].startswith(head)

    def test(pattern: str) -> bool:
        literals, prefixes, suffixes, _ = split_globs([pattern])
        if literals:
            return pattern in known
        if prefixes:
            return starts(forward, prefixes[0])
        if suffixes:
            return starts(backward, suffixes[0][::-1])
        toks, head = tokens(pattern), _literal_head(pattern)
        for text in forward[bisect_left(forward, head):]:  # the texts that start with the literal head, in order
            if not text.startswith(head):
                return False
            if match_tokens(toks, text):
                return True
        return False

    return test
