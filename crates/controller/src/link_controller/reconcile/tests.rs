//! Table tests of the pure steps of a reconcile.
