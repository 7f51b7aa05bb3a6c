//! Withdrawing a pending invitation from the members page, end to end on Postgres: the link
//! stops working at once, the page no longer lists it, and the audit log has one row.

use e2e::visitor::{hidden_csrf, invitation_link, new_email, Visitor};
use e2e::{Cluster, PostgresServer};

#[tokio::test]
async fn a_withdrawn_invitations_link_no_longer_joins_the_organization() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url()).arg("--sign-ups-per-minute=100")
    })
    .await;
    let gw = &cluster.pods[0];
    let mut owner = Visitor::new(gw);
    owner.sign_up(&new_email(), &[]).await;
    let email = new_email();
    let (status, page) = owner.invite(&email, "developer").await;
    assert_eq!(status, 200, "{page}");
    let link = invitation_link(gw, &email).await;

    let (_, page) = owner.get("/developers/members").await;
    let action = page
        .split("action=\"/developers/members/invitations/")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a withdraw button in {page}"));
    let path = format!("/developers/members/invitations/{action}");
    let csrf = hidden_csrf(&page);
    let (status, page, _) = owner.post(&path, &[("csrf", &csrf)], &[]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Invitation withdrawn."), "{page}");
    assert!(
        !page.contains(&format!("data-invited=\"{email}\"")),
        "{page}"
    );
    let (status, _, _) = owner.post(&path, &[("csrf", &csrf)], &[]).await;
    assert_eq!(status, 404, "withdrawn once");

    let mut invitee = Visitor::new(gw);
    invitee.sign_up(&email, &[]).await;
    let (status, page) = invitee.accept_invitation(&link).await;
    assert_ne!(status, 303, "the withdrawn link joins nothing: {page}");
    let role = pg
        .query(&format!(
            "SELECT role FROM dashboard_users WHERE email = '{email}'"
        ))
        .await;
    assert_eq!(role, "owner", "still the owner of their own account");
    let rows = pg
        .query_i64(&format!(
            "SELECT count(*) FROM audit_log WHERE action = 'invitation_withdrawn' AND target = '{email}'"
        ))
        .await;
    assert_eq!(rows, 1);
}
