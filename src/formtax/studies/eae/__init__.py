"""Event argument extraction (paper 001): ``data`` (the WikiEvents / GENEVA / ACE05 loaders), ``task`` (the
record-constrained task), ``scoring`` (argument-level precision / recall / F1) and ``report`` (its analysis)."""
