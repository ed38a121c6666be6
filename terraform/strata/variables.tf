variable "namespace" {
  description = "Kubernetes namespace of the deployment (created by this module)."
  type        = string
  default     = "strata"
}

variable "image" {
  description = "The Strata container image (built from infra/Dockerfile), e.g. registry.example/strata:1.0.0."
  type        = string
}

variable "journal_image" {
  description = "Image of the journal nodes only (default: image). Upgrades set it first, then frontend_image, then the compactor's (docs/OPERATIONS.md, \"Upgrading\")."
  type        = string
  default     = null
}

variable "frontend_image" {
  description = "Image of the frontends only (default: image)."
  type        = string
  default     = null
}

variable "compactor_image" {
  description = "Image of the compactor only (default: image)."
  type        = string
  default     = null
}

variable "journal_storage_class" {
  description = "Storage class of the journal's volumes: local NVMe (the journal commits at its disk's fsync rate). Default: the cluster's default class."
  type        = string
  default     = null
}

variable "bucket_name" {
  description = "S3 bucket for checkpoints (the compactor writes, frontends read)."
  type        = string
}

variable "create_bucket" {
  description = "Create the bucket here (false: it exists, e.g. on an S3-compatible server)."
  type        = bool
  default     = true
}

variable "object_store_env" {
  description = "AWS_* variables for the object store (AWS_REGION, AWS_ENDPOINT_URL, credentials) put in the strata-object-store secret; empty with workload identity."
  type        = map(string)
  default     = {}
  sensitive   = true
}

variable "manifests_dir" {
  description = "Folder of the Kubernetes manifests this module applies."
  type        = string
  default     = null
}

variable "tenant_domain" {
  description = "Domain under which each tenant has its name: kube-apiserver dials <tenant>.<domain>:2379 (a wildcard DNS record to the strata-frontend Service or its load balancer)."
  type        = string
}

variable "tenant_client_certificates" {
  description = "Tenants to issue a client certificate for (DNS name <tenant>.<domain>), in the `tenant_certificates` output; others are issued from the `ca` output."
  type        = set(string)
  default     = []
}

variable "admin_operators" {
  description = "Names to issue admin API client certificates for (the `admin_certificates` output)."
  type        = set(string)
  default     = ["operator"]
}

variable "ca_validity_hours" {
  description = "Validity of the deployment's CA (replacing it means new certificates for every client)."
  type        = number
  default     = 87600
}

variable "certificate_validity_hours" {
  description = "Validity of the server and client certificates; Terraform renews them in the last quarter, on the next apply."
  type        = number
  default     = 8760
}

variable "journal_certificate_nodes" {
  description = "How many journal pods (strata-journal-0 upwards) the journal nodes' internal certificate names. Grow it, and apply, before scaling the journal past it: a node dialled at a name its certificate lacks is refused by every peer and client."
  type        = number
  default     = 5
  validation {
    condition     = var.journal_certificate_nodes >= 3 && floor(var.journal_certificate_nodes) == var.journal_certificate_nodes
    error_message = "journal_certificate_nodes must be a whole number of at least 3 (the manifests run 3 journal nodes)."
  }
}

variable "internal_crl_pem" {
  description = "Certificate revocation lists (PEM) of the internal CA (the `ca` output's `internal`), or null. Set: the secret strata-internal-crl holds it and every journal node, frontend and compactor loads it (STRATA_INTERNAL_CRL_FILE): a certificate it revokes connects no more and its open connections are closed. A new list takes effect without a restart (docs/OPERATIONS.md). Null: no secret and no setting."
  type        = string
  default     = null
  validation {
    condition     = var.internal_crl_pem == null || can(regex("-----BEGIN X509 CRL-----", var.internal_crl_pem))
    error_message = "internal_crl_pem must be PEM revocation lists (-----BEGIN X509 CRL-----), or null."
  }
}
