# Provisions one Strata deployment: the checkpoint bucket, a namespace, the object-store secret,
# the frontends' auth token key, the deployment's CA with the frontends' and the admin API's
# certificates (and client certificates for the operators and the tenants named), and the
# Kubernetes objects of infra/kubernetes (journal StatefulSet, frontends, compactor), with the
# image, bucket and tenant domain substituted for the manifests' defaults.

locals {
  manifests_dir  = coalesce(var.manifests_dir, "${path.module}/../../infra/kubernetes")
  manifest_files = ["journal.yaml", "frontend.yaml", "compactor.yaml"]
  # Values in the manifests that this module replaces (kept as plain values so that
  # `kubectl apply -k infra/kubernetes` works on the same files).
  image_placeholder  = "image: strata:dev"
  bucket_placeholder = "s3://strata-checkpoints"
  # The domain under which each tenant has its name (<tenant>.<domain>).
  tenant_domain_placeholder = "tenants.example.com"
  # The journal's volume claim; the storage class goes in front of it when one is given.
  storage_placeholder = "        resources:\n          requests: {storage: 50Gi}"
  storage_class_line  = var.journal_storage_class == null ? "" : "        storageClassName: ${var.journal_storage_class}\n"
  # Every container's revocation list setting, commented out in the manifests (a process given
  # a list that is missing does not start); uncommented when internal_crl_pem is set, which
  # also creates the secret it reads.
  crl_placeholder = "# - {name: STRATA_INTERNAL_CRL_FILE,"
  crl_uncommented = "- {name: STRATA_INTERNAL_CRL_FILE,"
  crl_setting     = var.internal_crl_pem == null ? local.crl_placeholder : local.crl_uncommented

  # Each component's image: one release rolls out journal first, frontends next, the
  # compactor last (docs/OPERATIONS.md, "Upgrading") by setting these one apply at a time.
  images = {
    "journal.yaml"   = coalesce(var.journal_image, var.image)
    "frontend.yaml"  = coalesce(var.frontend_image, var.image)
    "compactor.yaml" = coalesce(var.compactor_image, var.image)
  }

  namespace = kubernetes_namespace_v1.strata.metadata[0].name
  # The names clients dial: a tenant's own, and the Services' inside the cluster.
  frontend_dns_names = [
    "*.${var.tenant_domain}",
    "strata-frontend",
    "strata-frontend.${var.namespace}.svc",
  ]
  admin_dns_names = ["strata-admin", "strata-admin.${var.namespace}.svc"]
  # Every name a journal node is dialled at (its peers' --peers, the frontends' and the
  # compactor's --journal, the leader addresses the nodes hand out), for the first
  # journal_certificate_nodes pods.
  internal_dns_names = flatten([
    for i in range(var.journal_certificate_nodes) : [
      "strata-journal-${i}.strata-journal",
      "strata-journal-${i}.strata-journal.${var.namespace}.svc",
      "strata-journal-${i}.strata-journal.${var.namespace}.svc.cluster.local",
    ]
  ])

  documents = flatten([
    for f in local.manifest_files : [
      for doc in split("\n---\n", replace(replace(replace(replace(replace(file("${local.manifests_dir}/${f}"),
        local.image_placeholder, "image: ${local.images[f]}"),
        local.bucket_placeholder, "s3://${var.bucket_name}"),
        local.tenant_domain_placeholder, var.tenant_domain),
        local.storage_placeholder, "${local.storage_class_line}${local.storage_placeholder}"),
      local.crl_placeholder, local.crl_setting)) : yamldecode(doc)
    ]
  ])
}

resource "aws_s3_bucket" "checkpoints" {
  count  = var.create_bucket ? 1 : 0
  bucket = var.bucket_name
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  count                   = var.create_bucket ? 1 : 0
  bucket                  = aws_s3_bucket.checkpoints[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  count  = var.create_bucket ? 1 : 0
  bucket = aws_s3_bucket.checkpoints[0].id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

# A compactor killed mid-upload leaves a multipart upload behind; no manifest names it, and
# this rule frees its parts.
resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  count  = var.create_bucket ? 1 : 0
  bucket = aws_s3_bucket.checkpoints[0].id
  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "kubernetes_namespace_v1" "strata" {
  metadata {
    name = var.namespace
  }
}

resource "kubernetes_secret_v1" "object_store" {
  count = length(var.object_store_env) > 0 ? 1 : 0
  metadata {
    name      = "strata-object-store"
    namespace = kubernetes_namespace_v1.strata.metadata[0].name
  }
  data = var.object_store_env
}

# The frontends' auth token key: 32 random bytes, made once and kept in the state (rotating it
# is a second key first: docs/OPERATIONS.md).
resource "random_bytes" "auth_token_key" {
  length = 32
}

resource "kubernetes_secret_v1" "auth_token" {
  metadata {
    name      = "strata-auth-token"
    namespace = kubernetes_namespace_v1.strata.metadata[0].name
  }
  binary_data = {
    key = random_bytes.auth_token_key.base64
  }
}

# Three CAs, kept in the Terraform state: one for the etcd port (the frontends' certificate and
# every tenant's client certificate, which names it as <tenant>.<domain>), one for the admin
# API (its server certificate and the operators'), one for internal TLS (the journal's mutual
# TLS with its peers, the frontends and the compactor). Separate, so that no tenant's
# certificate passes the admin API's mutual TLS, and neither a tenant's nor an operator's
# reaches the journal. Issue more certificates from the `ca` outputs.
locals {
  # Which CA signs what: server certificates and clients by purpose.
  signer = { frontend = "tenants", admin = "admin" }
  clients = merge(
    { for o in var.admin_operators : "admin/${o}" => {
      ca          = "admin"
      common_name = o
      dns_names   = []
    } },
    { for t in var.tenant_client_certificates : "tenant/${t}" => {
      ca          = "tenants"
      common_name = t
      dns_names   = ["${t}.${var.tenant_domain}"]
    } },
  )
}

resource "tls_private_key" "ca" {
  for_each    = toset(["tenants", "admin", "internal"])
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_self_signed_cert" "ca" {
  for_each              = tls_private_key.ca
  private_key_pem       = each.value.private_key_pem
  is_ca_certificate     = true
  validity_period_hours = var.ca_validity_hours
  allowed_uses          = ["cert_signing", "crl_signing", "digital_signature"]
  subject {
    common_name  = "strata ${var.namespace} ${each.key} CA"
    organization = "strata"
  }
}

# Server certificates: the frontends' (every tenant's name under the domain, and the
# Service's) and the admin API's.
resource "tls_private_key" "server" {
  for_each    = local.signer
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "server" {
  for_each        = tls_private_key.server
  private_key_pem = each.value.private_key_pem
  dns_names       = each.key == "frontend" ? local.frontend_dns_names : local.admin_dns_names
  subject {
    common_name = "strata-${each.key}"
  }
}

resource "tls_locally_signed_cert" "server" {
  for_each              = tls_cert_request.server
  cert_request_pem      = each.value.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca[local.signer[each.key]].private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca[local.signer[each.key]].cert_pem
  validity_period_hours = var.certificate_validity_hours
  early_renewal_hours   = var.certificate_validity_hours / 4
  allowed_uses          = ["digital_signature", "key_encipherment", "server_auth"]
}

resource "kubernetes_secret_v1" "frontend_tls" {
  metadata {
    name      = "strata-frontend-tls"
    namespace = local.namespace
  }
  type = "kubernetes.io/tls"
  data = {
    "tls.crt" = tls_locally_signed_cert.server["frontend"].cert_pem
    "tls.key" = tls_private_key.server["frontend"].private_key_pem
    "ca.crt"  = tls_self_signed_cert.ca["tenants"].cert_pem
  }
}

# Internal TLS, three certificates of the internal CA: the journal nodes' (valid for every name
# a node is dialled at, presented as a server's and, to their peers, as a client's), the one
# the frontends dial the journal with (valid for no name: the journal answers its Raft and
# admin services only to certificates valid for a member's host) and the compactor's (valid for
# strata-compactor, the one name besides the nodes' that the journal's Trim answers).
resource "tls_private_key" "internal" {
  for_each    = toset(["journal", "client", "compactor"])
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "internal" {
  for_each        = tls_private_key.internal
  private_key_pem = each.value.private_key_pem
  dns_names = (
    each.key == "journal" ? local.internal_dns_names :
    each.key == "compactor" ? ["strata-compactor"] : []
  )
  subject {
    common_name = "strata-internal-${each.key}"
  }
}

resource "tls_locally_signed_cert" "internal" {
  for_each              = tls_cert_request.internal
  cert_request_pem      = each.value.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca["internal"].private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca["internal"].cert_pem
  validity_period_hours = var.certificate_validity_hours
  early_renewal_hours   = var.certificate_validity_hours / 4
  allowed_uses = concat(
    ["digital_signature", "key_encipherment", "client_auth"],
    each.key == "journal" ? ["server_auth"] : [],
  )
}

resource "kubernetes_secret_v1" "internal_tls" {
  metadata {
    name      = "strata-internal-tls"
    namespace = local.namespace
  }
  type = "kubernetes.io/tls"
  data = {
    "tls.crt" = tls_locally_signed_cert.internal["journal"].cert_pem
    "tls.key" = tls_private_key.internal["journal"].private_key_pem
    "ca.crt"  = tls_self_signed_cert.ca["internal"].cert_pem
  }
}

resource "kubernetes_secret_v1" "internal_client_tls" {
  metadata {
    name      = "strata-internal-client-tls"
    namespace = local.namespace
  }
  type = "kubernetes.io/tls"
  data = {
    "tls.crt" = tls_locally_signed_cert.internal["client"].cert_pem
    "tls.key" = tls_private_key.internal["client"].private_key_pem
    "ca.crt"  = tls_self_signed_cert.ca["internal"].cert_pem
  }
}

resource "kubernetes_secret_v1" "internal_compactor_tls" {
  metadata {
    name      = "strata-internal-compactor-tls"
    namespace = local.namespace
  }
  type = "kubernetes.io/tls"
  data = {
    "tls.crt" = tls_locally_signed_cert.internal["compactor"].cert_pem
    "tls.key" = tls_private_key.internal["compactor"].private_key_pem
    "ca.crt"  = tls_self_signed_cert.ca["internal"].cert_pem
  }
}

# The internal CA's revocation lists, when internal_crl_pem is set. One secret of its own that
# every journal node, frontend and compactor mounts, rather than a key added to each of the
# three internal TLS secrets: one list for the whole deployment, replaced in one place and
# without touching the certificates' secrets (which cert-manager may own instead of this
# module). Kubernetes updates the mounted file in place, and each process loads a changed
# list within --internal-tls-reload-interval: a new list is an apply, not a restart.
resource "kubernetes_secret_v1" "internal_crl" {
  count = var.internal_crl_pem == null ? 0 : 1
  metadata {
    name      = "strata-internal-crl"
    namespace = local.namespace
  }
  data = {
    "crl.pem" = var.internal_crl_pem
  }
}

resource "kubernetes_secret_v1" "admin_tls" {
  metadata {
    name      = "strata-admin-tls"
    namespace = local.namespace
  }
  type = "kubernetes.io/tls"
  data = {
    "tls.crt" = tls_locally_signed_cert.server["admin"].cert_pem
    "tls.key" = tls_private_key.server["admin"].private_key_pem
    "ca.crt"  = tls_self_signed_cert.ca["admin"].cert_pem
  }
}

# Client certificates: one per operator of the admin API (its common name is the operator's
# name in the frontends' logs), one per tenant of `tenant_client_certificates` (its DNS name
# <tenant>.<domain> names the tenant, so kube-apiserver's --etcd-certfile reaches its own
# keyspace whatever it dials).
resource "tls_private_key" "client" {
  for_each    = local.clients
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "client" {
  for_each        = local.clients
  private_key_pem = tls_private_key.client[each.key].private_key_pem
  dns_names       = each.value.dns_names
  subject {
    common_name = each.value.common_name
  }
}

resource "tls_locally_signed_cert" "client" {
  for_each              = tls_cert_request.client
  cert_request_pem      = each.value.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca[local.clients[each.key].ca].private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca[local.clients[each.key].ca].cert_pem
  validity_period_hours = var.certificate_validity_hours
  early_renewal_hours   = var.certificate_validity_hours / 4
  allowed_uses          = ["digital_signature", "key_encipherment", "client_auth"]
}

resource "kubernetes_manifest" "strata" {
  for_each = { for d in local.documents : "${d.kind}/${d.metadata.name}" => d }
  # The workloads' revocation list volume is optional: without this, a pod given the setting
  # could start before the secret exists, find no list where it points, and fail.
  depends_on = [kubernetes_secret_v1.internal_crl]
  manifest = merge(each.value, {
    metadata = merge(each.value.metadata, { namespace = local.namespace })
  })
}
