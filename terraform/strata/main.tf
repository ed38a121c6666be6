# Provisions one Strata deployment: the checkpoint bucket, a namespace, the object-store secret,
# the frontends' auth token key,
# and the Kubernetes objects of infra/kubernetes (journal StatefulSet, frontends, compactor),
# with the image and bucket substituted for the manifests' defaults.

locals {
  manifests_dir = coalesce(var.manifests_dir, "${path.module}/../../infra/kubernetes")
  manifest_files = ["journal.yaml", "frontend.yaml", "compactor.yaml"]
  # Values in the manifests that this module replaces (kept as plain values so that
  # `kubectl apply -k infra/kubernetes` works on the same files).
  image_placeholder  = "image: strata:dev"
  bucket_placeholder = "s3://strata-checkpoints"
  # The journal's volume claim; the storage class goes in front of it when one is given.
  storage_placeholder = "        resources:\n          requests: {storage: 50Gi}"
  storage_class_line  = var.journal_storage_class == null ? "" : "        storageClassName: ${var.journal_storage_class}\n"

  # Each component's image: one release rolls out journal first, frontends next, the
  # compactor last (docs/OPERATIONS.md, "Upgrading") by setting these one apply at a time.
  images = {
    "journal.yaml"   = coalesce(var.journal_image, var.image)
    "frontend.yaml"  = coalesce(var.frontend_image, var.image)
    "compactor.yaml" = coalesce(var.compactor_image, var.image)
  }

  documents = flatten([
    for f in local.manifest_files : [
      for doc in split("\n---\n", replace(replace(replace(file("${local.manifests_dir}/${f}"),
        local.image_placeholder, "image: ${local.images[f]}"),
        local.bucket_placeholder, "s3://${var.bucket_name}"),
      local.storage_placeholder, "${local.storage_class_line}${local.storage_placeholder}")) : yamldecode(doc)
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

resource "kubernetes_manifest" "strata" {
  for_each = { for d in local.documents : "${d.kind}/${d.metadata.name}" => d }
  manifest = merge(each.value, {
    metadata = merge(each.value.metadata, { namespace = kubernetes_namespace_v1.strata.metadata[0].name })
  })
}
