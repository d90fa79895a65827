"""The control plane's side of the tenant gateway."""
