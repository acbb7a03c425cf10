"""OpenAI's annotations of a text as the protocol's citations (a text block's
``citations_delta``, which cites the text before it).

Both OpenAI APIs mark a web search's sources as a ``url_citation``: the Responses API
with its fields on the annotation, Chat Completions (OpenAI's search models, OpenRouter)
nested in a ``url_citation`` object. Either becomes the Anthropic format's citation of a
web search result, so every reader of the protocol (and every dialect) reads one shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from essessey.adapters._values import Malformed, opt_map, req_map, writable

__all__ = ["annotation", "citation", "nested_annotation"]


def annotation(value: object, where: str) -> dict[str, Any]:
    """An annotation as a provider sent it: an object orjson can write where the
    citation goes, ``delta.citation`` (else :class:`Malformed`, naming ``where``)."""
    return dict(writable(req_map(value, where), where))


def nested_annotation(value: object, where: str) -> dict[str, Any]:
    """A Chat Completions annotation, its ``url_citation`` object's fields brought up
    to the annotation, as the Responses API has them."""
    found = annotation(value, where)
    if found.get("type") == "url_citation":
        fields = opt_map(found.pop("url_citation", None), f"{where}.url_citation")
        if fields is None:
            raise Malformed(f"{where}.url_citation is missing")
        found.update((key, fields[key]) for key in fields if key not in found)
    return found


def citation(given: Mapping[str, Any], text: str) -> dict[str, Any]:
    """An annotation as a ``citations_delta``'s citation: a ``url_citation`` in the
    Anthropic format's shape for a web search result (``web_search_result_location``,
    with the cited span of ``text`` and its indexes kept), any other as it was given."""
    if given.get("type") != "url_citation":
        return dict(given)
    start, end = given.get("start_index"), given.get("end_index")
    spans = type(start) is int and type(end) is int and 0 <= start <= end <= len(text)
    return {
        "type": "web_search_result_location",
        "url": given.get("url"),
        "title": given.get("title"),
        "cited_text": text[start:end] if spans else "",
        "encrypted_index": "",
        "start_index": start,
        "end_index": end,
    }
