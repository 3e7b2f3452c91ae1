"""The watchcache filter's HTTP side: resources from discovery, the upstream list+watch, which
reads the cache answers (``plan``), and the bodies it answers with (``encode``)."""
