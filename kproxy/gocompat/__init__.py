"""Faithful ports of Go's parsers and encoders that decide what a request means.

kproxy decides on a request (which filter applies, whether a write is a dry run, who the caller
is) before the apiserver sees it, so wherever a caller controls the bytes, kproxy must read them
exactly as Go's net/http and the apiserver will: any difference is a request that means one thing
to kproxy's policy and another to the apiserver. One parser per thing lives here, each citing its
Go source. This package imports nothing from aiohttp and nothing else of kproxy.

Owns: ``url`` and ``net`` (net/url, net), ``httpguts`` (header rules), ``regexp`` (RE2 syntax),
``utf8``, ``yaml`` (yaml.v2/sigs.k8s.io/yaml decoding), ``jsondepth``, ``jsonindent``,
``jsonsyntax`` (encoding/json's syntax errors), ``jsonescape`` (encoding/json's string escaping),
``floatfmt`` (strconv float formatting), ``yamlquote`` (go-yaml's scalar resolution and quoting),
``strconv`` (``strconv.Quote``), ``strings`` (``strings.TrimSpace``, ``ToLower``, ``EqualFold``
with Go's own ``unicode`` tables, ``base64.RawURLEncoding``, ``httpguts.HeaderValuesContainsToken``).
"""
