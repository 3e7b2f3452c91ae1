"""Metadata-only reads from the cache: ``Accept: ...;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1``.

Metadata informers (client-go's ``metadata`` client: the garbage collector's and the resource-quota
controller's monitors of every resource, ``kubectl get`` of many objects) ask for objects' metadata
alone. The apiserver answers such a read of a built-in kind by transforming what it would have
sent (``endpoints/handlers/response.go``, ``asPartialObjectMetadata[List]``): each object becomes a
``meta.k8s.io/v1`` ``PartialObjectMetadata`` holding a copy of its ``ObjectMeta``, a list becomes a
``PartialObjectMetadataList`` (its items with their kind and apiVersion set), a watch event carries
the transformed object (bookmarks too), an ERROR its Status unchanged. The serializer is the
negotiated one; the Content-Type is the plain media type, as for any read.

The cache does the same from what it holds: the protobuf of a ``PartialObjectMetadata`` is field 1
of the object's own message (:meth:`kproxy.cacher.CachedObject.partial`), its JSON the codec's. A
read's media type carries the transform as a suffix (:func:`partial_media`) so that encoded bodies
and watch frames are kept and shared per form, as they are per media type. Custom resources (held
as JSON) are not transformed here: such reads go to the apiserver.
"""

from __future__ import annotations

from typing import Final

from kproxy.cacher import Kind
from kproxy.core.negotiation import Negotiated

#: The kind of every transformed object.
META_KIND: Final = Kind("meta.k8s.io/v1", "PartialObjectMetadata", "PartialObjectMetadataList", True)

_SUFFIX: Final = ";as=PartialObjectMetadata"


def partial_media(media_type: str) -> str:
    """The media type of a metadata-only read in ``media_type``."""
    return media_type + _SUFFIX


def base_media(media_type: str) -> tuple[str, bool]:
    """``(the serializer's media type, metadata only?)`` of a read's media type."""
    if media_type.endswith(_SUFFIX):
        return media_type[: -len(_SUFFIX)], True
    return media_type, False


def wants_partial(chosen: Negotiated, target: str) -> bool | None:
    """Whether the negotiated clause asks for ``target`` (``PartialObjectMetadata`` for an object or
    a watch, ``PartialObjectMetadataList`` for a list) in ``meta.k8s.io/v1``: True; False when it
    asks for no transform; None for any other transform (a Table, ``v1beta1``, the list form of an
    object...), which the cache leaves to the apiserver."""
    if chosen.convert is None:
        return False
    if chosen.convert == (target, "meta.k8s.io", "v1"):
        return True
    return None
