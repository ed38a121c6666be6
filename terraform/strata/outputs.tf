output "client_endpoint" {
  description = "A tenant's etcd endpoint (kube-apiserver's --etcd-servers), with {tenant} for its name."
  value       = "https://{tenant}.${var.tenant_domain}:2379"
}

output "admin_endpoint" {
  description = "The admin API inside the cluster (STRATA_ADMIN_ENDPOINT for `strata admin`)."
  value       = "https://strata-admin.${var.namespace}.svc:2382"
}

output "bucket" {
  description = "The checkpoint bucket."
  value       = var.bucket_name
}

output "ca" {
  description = "The deployment's CAs, by purpose: `tenants` (every etcd client's --cacert / --etcd-cafile; its key issues tenants' client certificates) and `admin` (the admin API's, for `strata admin --cacert` and operators' certificates) and `internal` (the journal's mutual TLS with its peers, the frontends and the compactor)."
  value = {
    for purpose, cert in tls_self_signed_cert.ca : purpose => {
      cert_pem        = cert.cert_pem
      private_key_pem = tls_private_key.ca[purpose].private_key_pem
    }
  }
  sensitive = true
}

output "tenant_certificates" {
  description = "Client certificate and key per tenant of tenant_client_certificates (kube-apiserver's --etcd-certfile and --etcd-keyfile)."
  value = {
    for t in var.tenant_client_certificates : t => {
      cert_pem        = tls_locally_signed_cert.client["tenant/${t}"].cert_pem
      private_key_pem = tls_private_key.client["tenant/${t}"].private_key_pem
    }
  }
  sensitive = true
}

output "admin_certificates" {
  description = "Client certificate and key per admin operator (`strata admin --cert --key`)."
  value = {
    for o in var.admin_operators : o => {
      cert_pem        = tls_locally_signed_cert.client["admin/${o}"].cert_pem
      private_key_pem = tls_private_key.client["admin/${o}"].private_key_pem
    }
  }
  sensitive = true
}
