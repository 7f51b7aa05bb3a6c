//! Prints the CRDs; its output is committed at `charts/gateway/files/crds.yaml` and checked by
//! the `crd_drift` test.

fn main() -> Result<(), serde_yaml::Error> {
    print!("{}", crds::resources::crd_yaml()?);
    Ok(())
}
