"""`deferdump explain`: a TLC counterexample rendered as a timeline, text and an HTML page."""
