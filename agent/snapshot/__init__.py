"""The host snapshot: the model, how it is taken, how two are compared, and what drift it shows."""
