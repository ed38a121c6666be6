output "client_endpoint" {
  description = "etcd endpoint for clients inside the cluster (kube-apiserver's --etcd-servers)."
  value       = "http://strata-frontend.${var.namespace}.svc:2379"
}

output "bucket" {
  description = "The checkpoint bucket."
  value       = var.bucket_name
}
