//! Account- and container-level operations: list, create and delete
//! containers; list blobs (one page, every page following markers, or the
//! first blob).

use reqwest::Method;

use super::client::{BlobClient, Request, Resource};
use super::error::{Error, ErrorKind, Result};
use super::path::validate_container_name;
use super::types::{BlobItem, BlobListPage, BlobListing, ContainerItem, ListBlobsOptions};
use super::xml;

/// Upper bound on pages followed by the `list_all_*` calls (5000 entries
/// each), so a service that keeps returning a marker cannot loop forever.
const MAX_LIST_PAGES: usize = 100_000;

fn protocol(op: &'static str, target: &str, msg: String) -> Error {
    Error::other(ErrorKind::Protocol, op, target, msg)
}

impl BlobClient {
    /// Every container of the account (follows continuation markers).
    pub async fn list_containers(&self) -> Result<Vec<ContainerItem>> {
        const OP: &str = "list containers";
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut req = Request::new(OP, Method::GET, Resource::Account).query("comp", "list");
            if let Some(m) = &marker {
                req = req.query("marker", m.clone());
            }
            let resp = self.execute(req).await.0?;
            let (items, next) = xml::parse_containers(&resp.body)
                .map_err(|m| protocol(OP, self.account_name(), m))?;
            out.extend(items);
            match next {
                Some(m) => marker = Some(m),
                None => return Ok(out),
            }
        }
        Err(protocol(
            OP,
            self.account_name(),
            "too many listing pages".into(),
        ))
    }

    /// Create container `name`. Returns false if it already existed.
    pub async fn create_container(&self, name: &str) -> Result<bool> {
        validate_container_name(name)?;
        let req = Request::new("create container", Method::PUT, Resource::Container(name))
            .query("restype", "container");
        match self.execute(req).await {
            (Ok(_), _) => Ok(true),
            (Err(e), _) if e.code() == Some("ContainerAlreadyExists") => Ok(false),
            (Err(e), _) => Err(e),
        }
    }

    /// Delete container `name` and everything in it.
    pub async fn delete_container(&self, name: &str) -> Result<()> {
        validate_container_name(name)?;
        let req = Request::new(
            "delete container",
            Method::DELETE,
            Resource::Container(name),
        )
        .query("restype", "container");
        match self.execute(req).await {
            (Ok(_), _) => Ok(()),
            // A retry after a first attempt that did delete it.
            (Err(e), attempts) if attempts > 1 && e.is_not_found() => Ok(()),
            (Err(e), _) => Err(e),
        }
    }

    /// One page of the blob listing of `container`.
    pub async fn list_blobs(
        &self,
        container: &str,
        opts: &ListBlobsOptions,
    ) -> Result<BlobListPage> {
        const OP: &str = "list blobs";
        validate_container_name(container)?;
        let mut req = Request::new(OP, Method::GET, Resource::Container(container))
            .query("restype", "container")
            .query("comp", "list");
        if let Some(p) = &opts.prefix {
            req = req.query("prefix", p.clone());
        }
        if let Some(d) = &opts.delimiter {
            req = req.query("delimiter", d.clone());
        }
        let include: Vec<&str> = [
            (opts.include_metadata, "metadata"),
            (opts.include_snapshots, "snapshots"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if !include.is_empty() {
            req = req.query("include", include.join(","));
        }
        if let Some(m) = &opts.marker {
            req = req.query("marker", m.clone());
        }
        if let Some(n) = opts.max_results {
            req = req.query("maxresults", n.to_string());
        }
        let resp = self.execute(req).await.0?;
        xml::parse_blobs(&resp.body).map_err(|m| protocol(OP, container, m))
    }

    /// The first blob (or snapshot) of the listing of `container` with
    /// `opts`, `None` when it has none. The service may answer a page with
    /// fewer entries than `max_results` asked for, even none, and a marker:
    /// only a page without a marker ends the listing, so markers are
    /// followed until an entry comes.
    pub async fn first_blob(
        &self,
        container: &str,
        opts: &ListBlobsOptions,
    ) -> Result<Option<BlobItem>> {
        let mut opts = opts.clone();
        for _ in 0..MAX_LIST_PAGES {
            let page = self.list_blobs(container, &opts).await?;
            if let Some(first) = page.blobs.into_iter().next() {
                return Ok(Some(first));
            }
            match page.next_marker {
                Some(m) => opts.marker = Some(m),
                None => return Ok(None),
            }
        }
        Err(protocol(
            "list blobs",
            container,
            "too many listing pages".into(),
        ))
    }

    /// The whole blob listing of `container` (follows markers from
    /// `opts.marker`, or from the start).
    pub async fn list_all_blobs(
        &self,
        container: &str,
        opts: &ListBlobsOptions,
    ) -> Result<BlobListing> {
        let mut opts = opts.clone();
        let mut out = BlobListing::default();
        for _ in 0..MAX_LIST_PAGES {
            let page = self.list_blobs(container, &opts).await?;
            out.blobs.extend(page.blobs);
            out.prefixes.extend(page.prefixes);
            match page.next_marker {
                Some(m) => opts.marker = Some(m),
                None => return Ok(out),
            }
        }
        Err(protocol(
            "list blobs",
            container,
            "too many listing pages".into(),
        ))
    }
}
