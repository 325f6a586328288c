"""Read models fed by bus events, one module per read model; ``entrypoints.bus`` says which event goes where."""
