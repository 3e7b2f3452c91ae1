"""Hostile requests through a real `kproxy run` to the real apiserver, each verdict checked at the
apiserver (what was persisted, who the caller was), and a differential fuzzer that sends the same
mutated bytes directly and through kproxy."""
