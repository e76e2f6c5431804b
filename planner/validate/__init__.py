"""``autoplan validate``: run a plan's layouts (or dry-run them on fake tensors), compare with the
prediction per component, calibrate, and draw plan pictures (``plot``)."""
