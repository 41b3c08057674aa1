"""The local control plane: etcd, kube-apiserver, controllers, schedulers and kwok as local processes."""
