"""Remote steps and remote workflows: the runtime's side of the transports."""
