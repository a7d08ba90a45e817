//! The Kubernetes-object fence's I11 window.

mod i11_window;
