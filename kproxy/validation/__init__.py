"""Server-side field validation engine, identical to the apiserver's strict decoding.

No aiohttp here: the engine takes bytes and schemas and returns the apiserver's own error
texts; ``kproxy.filters.validation`` adapts it to HTTP. Modules:

* ``levels``    -- the ``fieldValidation`` levels;
* ``schema``    -- OpenAPI v3 documents compiled once into ``Node`` trees;
* ``decode``    -- JSON and YAML bodies with duplicate-key detection;
* ``validator`` -- the walkers (Go struct decoding for built-ins, pruning for custom resources);
* ``messages``  -- ``Warning`` header values and the Strict error texts;
* ``openapi``   -- the schema cache that reads ``/openapi/v3`` from the upstream.
"""

from kproxy.validation.levels import Level, parse_level
from kproxy.validation.validator import Outcome, validate_body

__all__ = ["Level", "Outcome", "parse_level", "validate_body"]
