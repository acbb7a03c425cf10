"""A provider compacting a long conversation, as the protocol's ``compaction`` block.

Anthropic streams a ``compaction`` block (a readable summary, and ``encrypted_content`` or,
on demand, a ``signature`` to send it back with); the Responses API makes a
``compaction`` item (``encrypted_content`` only); the frameworks pass either on in their
own shapes. Every adapter publishes the block Anthropic's format has, carried whole, so
every reader of the protocol (and every dialect) reads one shape: what a client that keeps
no state with the provider sends back in the conversation's place.
"""

from __future__ import annotations

from typing import Any

from essessey.adapters._values import clean

__all__ = ["compaction_block"]


def compaction_block(
    content: object, encrypted: object, signature: object
) -> dict[str, Any] | None:
    """``{"type": "compaction", "content", "encrypted_content"}`` (and ``signature`` when
    given) from what a provider gave, each only when it is a string (the summary's lone
    surrogates replaced); None when none of them is there, which has nothing to send
    back."""
    block: dict[str, Any] = {
        "type": "compaction",
        "content": clean(content) if isinstance(content, str) and content else None,
        "encrypted_content": encrypted if isinstance(encrypted, str) and encrypted else None,
    }
    if isinstance(signature, str) and signature:
        block["signature"] = signature
    if block["content"] is None and block["encrypted_content"] is None and "signature" not in block:
        return None
    return block
