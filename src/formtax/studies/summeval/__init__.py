"""SummEval (paper 001 section 4.3): ``task`` (the judge prompt and its rating answer) and ``judge`` (the
correlations with the expert ratings, registered with the report)."""
