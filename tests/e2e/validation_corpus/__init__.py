"""The field-validation corpus: (verb, resource, content type, body) cases whose answers are
compared between the apiserver directly and kproxy, at every ``fieldValidation`` level."""
