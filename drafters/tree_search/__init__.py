"""Tree search for drafters that grow token trees from their own distributions: EAGLE-2's dynamic
trees and sampled-sibling trees on the host (`dynamic`) and the same top-k tree as fixed-shape
tensor operations, one compiled step (`graph`); they may import `specdec.types`, `specdec.trees`,
`specdec.sampling` and `specdec.protocols`."""
