"""`deferdump mro`: read connector source, resolve method ownership by C3, label behaviours, judge by TLC."""
