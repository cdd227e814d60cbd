//! Small text edits of MJCF (MuJoCo XML) files.
//!
//! Some dm_control tasks rewrite their model's XML before compiling it (dog's
//! `make_model` resizes the floor and drops the ball, target, walls and two
//! cameras). Editing the text and compiling the result reproduces that
//! exactly, whereas edits of a compiled `MjModel` cannot remove elements.
//!
//! The scanner understands what MJCF files use: elements, quoted attributes,
//! comments and processing instructions. It is not a general XML parser (no
//! DTDs, CDATA or entities), which the suite's models do not need.

use std::ops::Range;

/// One markup item of the document, by byte range.
#[derive(Debug, Clone)]
enum Item {
    /// `<tag ...>` or `<tag .../>`.
    Start { tag: Range<usize>, whole: Range<usize>, self_closing: bool },
    /// `</tag>`.
    End { whole: Range<usize> },
}

fn scan(xml: &str) -> Result<Vec<Item>, String> {
    let b = xml.as_bytes();
    let find_from = |from: usize, pat: &str| xml[from..].find(pat).map(|i| from + i);
    let mut items = Vec::new();
    let mut i = 0;
    while let Some(lt) = find_from(i, "<") {
        let rest = &xml[lt..];
        if rest.starts_with("<!--") {
            i = find_from(lt + 4, "-->").ok_or("unterminated comment")? + 3;
        } else if rest.starts_with("<?") {
            i = find_from(lt + 2, "?>").ok_or("unterminated processing instruction")? + 2;
        } else if rest.starts_with("</") {
            let gt = find_from(lt, ">").ok_or("unterminated end tag")?;
            items.push(Item::End { whole: lt..gt + 1 });
            i = gt + 1;
        } else {
            let name_end = (lt + 1..b.len())
                .find(|&k| b[k].is_ascii_whitespace() || b[k] == b'/' || b[k] == b'>')
                .ok_or("unterminated start tag")?;
            // Attribute values may contain '>' or '/', so skip quoted text.
            let mut k = name_end;
            let mut quote = None;
            while k < b.len() {
                match (quote, b[k]) {
                    (None, q @ (b'"' | b'\'')) => quote = Some(q),
                    (Some(q), c) if c == q => quote = None,
                    (None, b'>') => break,
                    _ => {}
                }
                k += 1;
            }
            if k == b.len() {
                return Err("unterminated start tag".into());
            }
            items.push(Item::Start { tag: lt + 1..name_end, whole: lt..k + 1, self_closing: b[k - 1] == b'/' });
            i = k + 1;
        }
    }
    Ok(items)
}

/// The byte range of attribute `attr`'s value inside the start tag at `tag`.
fn attribute_value(xml: &str, tag: Range<usize>, attr: &str) -> Option<Range<usize>> {
    let b = xml.as_bytes();
    let mut k = tag.start;
    while k < tag.end {
        // Skip to the next attribute name.
        while k < tag.end && (b[k].is_ascii_whitespace() || b[k] == b'<' || b[k] == b'/' || b[k] == b'>') {
            k += 1;
        }
        let name_start = k;
        while k < tag.end && !(b[k].is_ascii_whitespace() || b[k] == b'=' || b[k] == b'/' || b[k] == b'>') {
            k += 1;
        }
        let name = &xml[name_start..k];
        while k < tag.end && b[k].is_ascii_whitespace() {
            k += 1;
        }
        if k >= tag.end || b[k] != b'=' {
            // The element name itself, or a value-less token.
            continue;
        }
        k += 1;
        while k < tag.end && b[k].is_ascii_whitespace() {
            k += 1;
        }
        if k >= tag.end {
            return None;
        }
        let quote = b[k];
        let value_start = k + 1;
        let value_end = xml[value_start..tag.end].find(quote as char)? + value_start;
        if name == attr {
            return Some(value_start..value_end);
        }
        k = value_end + 1;
    }
    None
}

/// Where the unique `<tag name="name">` element sits: its start tag and its
/// whole extent (through the matching end tag).
fn find_element(xml: &str, tag: &str, name: &str) -> Result<(Range<usize>, Range<usize>), String> {
    let items = scan(xml)?;
    let mut found = None;
    for (idx, item) in items.iter().enumerate() {
        if let Item::Start { tag: t, whole, .. } = item {
            if &xml[t.clone()] == tag && attribute_value(xml, whole.clone(), "name").is_some_and(|v| &xml[v] == name) {
                if found.is_some() {
                    return Err(format!("more than one <{tag} name=\"{name}\">"));
                }
                found = Some(idx);
            }
        }
    }
    let idx = found.ok_or_else(|| format!("no <{tag} name=\"{name}\">"))?;
    let Item::Start { whole: start, self_closing, .. } = items[idx].clone() else { unreachable!() };
    if self_closing {
        return Ok((start.clone(), start));
    }
    let mut depth = 0usize;
    for item in &items[idx + 1..] {
        match item {
            Item::Start { self_closing: true, .. } => {}
            Item::Start { .. } => depth += 1,
            Item::End { whole } if depth == 0 => return Ok((start.clone(), start.start..whole.end)),
            Item::End { .. } => depth -= 1,
        }
    }
    Err(format!("<{tag} name=\"{name}\"> is never closed"))
}

/// Removes the unique element `<tag name="name">` with its children (like
/// lxml's `parent.remove(element)`; the surrounding whitespace stays, which
/// MuJoCo ignores).
pub fn remove_element(xml: &mut String, tag: &str, name: &str) -> Result<(), String> {
    let (_, whole) = find_element(xml, tag, name)?;
    xml.replace_range(whole, "");
    Ok(())
}

/// Sets attribute `attr` of the unique element `<tag name="name">` to
/// `value`, adding the attribute when it is absent.
pub fn set_attribute(xml: &mut String, tag: &str, name: &str, attr: &str, value: &str) -> Result<(), String> {
    if value.contains(['"', '<', '&']) {
        return Err(format!("attribute value {value:?} would need escaping"));
    }
    let (start, _) = find_element(xml, tag, name)?;
    match attribute_value(xml, start.clone(), attr) {
        Some(range) => xml.replace_range(range, value),
        None => {
            let close = if xml[..start.end].ends_with("/>") { start.end - 2 } else { start.end - 1 };
            xml.insert_str(close, &format!(" {attr}=\"{value}\""));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"<?xml version="1.0"?>
<mujoco>
  <!-- <body name="ball"/> in a comment is not an element -->
  <worldbody>
    <geom name="floor" type="plane" size="10 10 0.1"/>
    <body name="ball" pos="0 0 1">
      <body name="inner"><geom name="g"/></body>
      <geom name="ball" size=".03"/>
    </body>
    <camera name="ball" mode="targetbody" target="ball" label="a>b"/>
    <geom name="target" type="cylinder"/>
  </worldbody>
</mujoco>
"#;

    #[test]
    fn removes_nested_and_self_closing_elements() {
        let mut xml = DOC.to_string();
        remove_element(&mut xml, "body", "ball").unwrap();
        assert!(!xml.contains("inner") && !xml.contains("size=\".03\""));
        assert!(xml.contains(r#"<camera name="ball""#), "other tags of the same name stay");
        remove_element(&mut xml, "camera", "ball").unwrap();
        assert!(!xml.contains("<camera"));
        assert!(xml.contains("<!-- <body name=\"ball\"/>"), "comments are left alone");
        assert!(xml.contains(r#"<geom name="target" type="cylinder"/>"#));
        assert!(remove_element(&mut xml, "body", "ball").unwrap_err().contains("no <body"));
    }

    #[test]
    fn sets_existing_and_new_attributes() {
        let mut xml = DOC.to_string();
        set_attribute(&mut xml, "geom", "floor", "size", "135 135 .1").unwrap();
        assert!(xml.contains(r#"<geom name="floor" type="plane" size="135 135 .1"/>"#));
        set_attribute(&mut xml, "geom", "target", "rgba", "1 0 0 1").unwrap();
        assert!(xml.contains(r#"<geom name="target" type="cylinder" rgba="1 0 0 1"/>"#));
        set_attribute(&mut xml, "body", "ball", "pos", "1 2 3").unwrap();
        assert!(xml.contains(r#"<body name="ball" pos="1 2 3">"#));
    }

    #[test]
    fn rejects_ambiguous_names() {
        let mut xml = "<a><g name=\"x\"/><g name=\"x\"/></a>".to_string();
        assert!(remove_element(&mut xml, "g", "x").unwrap_err().contains("more than one"));
    }
}
