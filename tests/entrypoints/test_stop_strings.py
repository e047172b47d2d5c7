"""Stop strings over streamed text (`specdec.entrypoints.server.StopMatcher`), however the text is cut
into pieces: a stop string that spans pieces is still caught, text once sent is never taken
back, so a piece that might begin a stop string is held until the next one decides, and
nothing after the cut is sent. The oracle reads the whole text at once: generation ends at
the first piece boundary E where some stop string lies inside text[:E], and the answer is
the text before the earliest such stop string.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specdec.entrypoints.server import StopMatcher

ALPHABET = "ab é中"


def _oracle(text: str, bounds: list[int], stops: list[str]) -> str:
    for end in bounds:
        hits = [text[:end].find(s) for s in stops if s and s in text[:end]]
        if hits:
            return text[: min(hits)]
    return text


@given(
    text=st.text(ALPHABET, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=12),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_streamed_pieces_are_cut_exactly_where_the_whole_text_is(text, cuts, stops):
    bounds = sorted({c for c in cuts if 0 < c < len(text)} | {len(text)})
    pieces = [text[a:b] for a, b in zip([0] + bounds, bounds)]
    matcher, sent, hit = StopMatcher(stops), [], False
    for piece in pieces:
        out, hit = matcher.push(piece)
        sent.append(out)
        if hit:
            break
    if not hit:
        sent.append(matcher.flush())
    emitted = "".join(sent)
    assert emitted == _oracle(text, bounds, stops)
    assert not any(s in emitted for s in stops)


def test_a_stop_string_across_two_pieces_is_held_back_then_cut():
    m = StopMatcher(["w64 w64"])
    assert m.push("w50 w68") == ("w50 w68", False)
    assert m.push(" w64") == (" ", False)  # "w64" could begin "w64 w64": held
    assert m.push(" w64") == ("", True)  # it did: the text ends before the stop string
    m = StopMatcher(["w64 w64"])
    m.push("w50 w64")
    assert m.push(" w1") == ("w64 w1", False)  # it did not: the held text goes out
    assert m.flush() == ""
