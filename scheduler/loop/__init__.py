"""The decision loop (scheduler/README.md "Decision loop"): every period, live signals in,
a policy decides, the mesh carries the actions out."""
